"""The instrument chooses a probe's layer on prompts it was not fitted on, and for natural English on
held-out templates: a layer that only learned the training templates' words must lose to one that
reads the state (hand-made activations where the answer is known)."""

import numpy as np
import torch


def _acts(y: np.ndarray, spurious: bool, rng) -> torch.Tensor:
    """[3 layers, n, 8]: layer 0 holds y exactly when ``spurious`` (the training templates) and noise
    otherwise; layer 1 is noise; layer 2 holds y under noise everywhere (about 0.84 readable)."""
    n = len(y)
    sign = 2.0 * y - 1.0
    x = rng.normal(size=(3, n, 8))
    x[0, :, 0] = sign if spurious else rng.normal(size=n)
    x[2, :, 0] = 0.5 * sign + 0.5 * rng.normal(size=n)
    return torch.tensor(x, dtype=torch.float32)


def test_layer_is_chosen_on_held_out_templates_when_given():
    from beliefscope.analyses.instrument import fit_probes, layer_accuracy

    rng = np.random.default_rng(0)
    y_train, y_dev, y_test = (rng.integers(0, 2, size=n) for n in (400, 200, 400))
    X_train, X_dev, X_test = (_acts(y, s, rng) for y, s in ((y_train, True), (y_dev, False), (y_test, False)))
    prompts = np.arange(400) // 4

    _, by_train = fit_probes(X_train, y_train, prompts)  # 20% of the training prompts: the spurious layer wins
    assert by_train == 0
    probe, by_dev = fit_probes(X_train, y_train, prompts, dev=(X_dev, y_dev))
    assert by_dev == 2
    test = layer_accuracy(probe, X_test, y_test)  # and on unseen held-out rows it is the better layer
    assert test[2] > 0.75 and test[0] < 0.6, test
