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


def test_probe_offset_reads_the_token_after_each_boundary_with_the_boundary_labels():
    """collect(offset=1) gives the residual one token after each event's last token (reference: the
    same model's hook on the whole prompt) with the labels at the boundary; past the prompt: refused."""
    import pytest

    from beliefscope.analyses.instrument import collect
    from beliefscope.hooks import capture
    from beliefscope.models.load import load_model
    from beliefscope.tasks import get_task

    model, tok = load_model("thinking-variables")
    exs = get_task("variables").examples(3, 5, (2, 4))
    at0, at1 = collect(model, tok, exs, forced=False), collect(model, tok, exs, forced=False, offset=1)
    assert (at0["truth"] == at1["truth"]).all() and (at0["values"] == at1["values"]).all()
    lab = exs[0].labels(tok)
    pos = np.nonzero(lab.is_event_boundary)[0] + 1
    with capture(model, ["blocks.1.hook_resid_post"]) as cap:
        model(torch.as_tensor(lab.input_ids)[None], return_type=None)
    ref = cap.stacked("blocks.1.hook_resid_post")[0, pos]  # [n_events, d]
    assert torch.allclose(at1["X"][2, : len(pos)], ref.float(), atol=1e-5)
    assert not torch.allclose(at0["X"][2, : len(pos)], ref.float(), atol=1e-3)
    with pytest.raises(ValueError, match="probe_offset=99 reads past"):
        collect(model, tok, exs, forced=False, offset=99)
