"""Probes: torch trainer vs scikit-learn, streaming vs in-memory, position classes, save/load,
controls and splits, and the report's CV accuracy against scikit-learn's GroupKFold."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold, cross_val_predict
from sklearn.preprocessing import StandardScaler

from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.probes.controls import control_labels, majority_accuracy, position_mask, prompt_folds
from beliefscope.probes.harvest import EMBED_HOOK, row_labels
from beliefscope.probes.linear import LinearProbe, fit_all_layers
from beliefscope.probes.report import ReportConfig, probe_report
from beliefscope.probes.store import LABEL_NAMES, ActivationStore
from beliefscope.tasks import get_task


def synthetic(L=3, n=1500, d=16, seed=0):
    """Layer 1 holds the label linearly with noise, the others do not."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(L, n, d, generator=g)
    w = torch.randn(d, generator=g)
    y = ((X[1] @ w) + 2.0 * torch.randn(n, generator=g) > 0).long()
    return X, y


def test_torch_trainer_matches_sklearn_per_layer():
    Xa, ya = synthetic(n=3000)
    X, y, Xt, yt = Xa[:, :1500], ya[:1500], Xa[:, 1500:], ya[1500:]  # held-out rows, same generator
    pt = fit_all_layers(X, y, trainer="torch")
    ps = fit_all_layers(X, y, trainer="sklearn")
    for i, h in enumerate(pt.hooks):
        assert abs(pt.accuracy(X[i], y, h) - ps.accuracy(X[i], y, h)) <= 0.01
        assert abs(pt.accuracy(Xt[i], yt, h) - ps.accuracy(Xt[i], yt, h)) <= 0.01
    torch.testing.assert_close(pt.W, ps.W, atol=2e-3, rtol=2e-3)  # same convex objective, same optimum
    assert pt.accuracy(Xt[1], yt, pt.hooks[1]) > 0.75
    assert pt.accuracy(Xt[0], yt, pt.hooks[0]) < 0.6


def test_multiclass_matches_sklearn():
    X, _ = synthetic(L=2, n=900)
    y = torch.as_tensor(np.digitize(X[0, :, 0].numpy(), [-0.5, 0.5]))  # 3 classes from feature 0
    pt, ps = fit_all_layers(X, y, trainer="torch"), fit_all_layers(X, y, trainer="sklearn")
    assert pt.n_classes == 3
    torch.testing.assert_close(pt.W, ps.W, atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(pt.b, ps.b, atol=5e-3, rtol=5e-3)


def distance_to_optimum(X, y, probe, hook, C=1.0, mean=None, std=None):
    """A bound on how far a binary probe at `hook` is from the exact optimum of its objective, and its
    parameters ``theta = [w; b]``, both in float64 in the standardised space of ``mean / std`` (the
    probe's own by default).

    The objective ``mean_i CE + ||w||^2 / (2 C n)`` is strongly convex. With ``g`` its gradient and
    ``H`` its Hessian at theta, ``||theta - theta*|| <= ||g|| / mu`` for ``mu`` the least curvature on
    the segment to theta*. The logistic weight ``s(z)(1 - s(z))`` falls by at most ``exp(-|dz|)`` when
    a logit moves by ``dz``, and ``|dz| <= R r`` with ``R`` the largest row norm (bias included) and
    ``r`` the distance: so ``mu >= exp(-R r) lambda_min(H)``, and ``r <= ||g|| / (0.9 lambda_min(H))``
    wherever ``R r <= 0.1`` (which this checks). Summation order moves ``g`` by float32 rounding only;
    the bound holds on any CPU."""
    i = probe.hooks.index(hook)
    mean = probe.mean[i] if mean is None else mean
    std = probe.std[i] if std is None else std
    w = probe.W[i, :, 0].double() * std.double() / probe.std[i].double()  # the same function in these units
    shift = (mean.double() - probe.mean[i].double()) / probe.std[i].double()  # [d]
    b = probe.b[i, 0].double() + shift @ probe.W[i, :, 0].double()
    Z = (X[i].double() - mean.double()) / std.double()  # [n, d]
    Z1 = torch.cat([Z, torch.ones(len(Z), 1, dtype=torch.float64)], 1)  # [n, d + 1]
    n, d = Z.shape
    theta = torch.cat([w, b[None]])  # [d + 1]
    p = torch.sigmoid(Z1 @ theta)
    reg = torch.cat([torch.full((d,), 1 / (C * n), dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])
    g = Z1.T @ (p - y.double()) / n + reg * theta  # [d + 1]
    H = (Z1.T * (p * (1 - p))) @ Z1 / n + torch.diag(reg)  # [d + 1, d + 1]
    r = float(g.norm()) / (0.9 * float(torch.linalg.eigvalsh(H)[0]))
    R = float(Z1.norm(dim=1).max())
    assert R * r <= 0.1, f"too far from the optimum for the local bound: R r = {R * r:.3g}"
    return r, theta


def test_streaming_chunks_equal_in_memory():
    """Streamed and in-memory fits minimise one objective; both must be within the solver's accuracy of
    its exact optimum, so within the sum of their bounds of each other. The tolerance comes from each
    fit's own gradient (float64), not from one machine's summation order (it failed on AVX-512 Xeons at
    a fixed atol 1e-3, when L-BFGS stopped on a small change of a float32 loss)."""
    X, y = synthetic()
    full = fit_all_layers(X, y, trainer="torch")
    parts = [(X[:, s], y[s], torch.zeros(len(y[s]), dtype=torch.long))
             for s in (slice(0, 400), slice(400, 1100), slice(1100, None))]
    streamed = fit_all_layers(lambda: iter(parts), trainer="torch", n_classes=2)
    # moments: float64 sums of the same rows in another grouping, so equal to float64 rounding
    torch.testing.assert_close(streamed.mean, full.mean, atol=1e-6, rtol=1e-6)
    for h in full.hooks:
        r_full, t_full = distance_to_optimum(X, y, full, h)
        i = full.hooks.index(h)
        r_streamed, t_streamed = distance_to_optimum(X, y, streamed, h, mean=full.mean[i], std=full.std[i])
        assert max(r_full, r_streamed) <= 2e-4, (h, r_full, r_streamed)  # the solver's accuracy, on the full data
        assert float((t_streamed - t_full).norm()) <= r_full + r_streamed, h


def test_streaming_that_drops_a_chunk_is_caught():
    """The bound above can fail: a streamed fit that never saw the last chunk is far from the optimum."""
    X, y = synthetic()
    parts = [(X[:, s], y[s], torch.zeros(len(y[s]), dtype=torch.long)) for s in (slice(0, 400), slice(400, 1100))]
    partial = fit_all_layers(lambda: iter(parts), trainer="torch", n_classes=2)
    full = fit_all_layers(X, y, trainer="torch")
    i = 1  # the layer that holds the label
    with pytest.raises(AssertionError):
        r, _ = distance_to_optimum(X, y, partial, full.hooks[i], mean=full.mean[i], std=full.std[i])
        assert r <= 2e-4


def test_position_classes_fit_like_separate_runs():
    X, y = synthetic()
    cls = torch.arange(len(y)) % 2
    both = fit_all_layers(X, y, groups=cls, n_groups=2, trainer="torch")
    for k in range(2):
        rows = cls == k
        alone = fit_all_layers(X[:, rows], y[rows], trainer="sklearn")
        # standardisation uses all rows in the joint run, so compare predictions, not weights
        for i, h in enumerate(alone.hooks):
            agree = (both[k].predict(X[i, rows], h) == alone.predict(X[i, rows], h)).float().mean()
            assert agree > 0.97


def test_save_load_roundtrip_and_wrong_inputs(tmp_path):
    X, y = synthetic()
    probe = fit_all_layers(X, y, hooks=["a", "b", "c"], meta={"store_hash": "abc"})
    probe.save(str(tmp_path / "p"))
    back = LinearProbe.load(str(tmp_path / "p"))
    assert back.meta["store_hash"] == "abc" and back.hooks == ["a", "b", "c"]
    torch.testing.assert_close(back.logits(X[1], "b"), probe.logits(X[1], "b"))
    with pytest.raises(ValueError, match=r"expects activations \[n, 16\], got \[5, 8\]"):
        back.predict(torch.randn(5, 8), "b")
    with pytest.raises(KeyError, match="no layer 'blocks.9.hook_resid_post'"):
        back.predict(X[1], "blocks.9.hook_resid_post")
    with pytest.raises(FileNotFoundError, match="probe.json is missing"):
        LinearProbe.load(str(tmp_path / "none"))
    with pytest.raises(ValueError, match="trainer 'jax' is unknown"):
        fit_all_layers(X, y, trainer="jax")


def test_probe_direction_raises_the_target_logit():
    X, y = synthetic()
    probe = fit_all_layers(X, y, hooks=["a", "b", "c"])
    v = probe.direction("b", toward=1, away=0)
    x = X[1, :5]
    gap = lambda z: (probe.logits(z, "b")[:, 1] - probe.logits(z, "b")[:, 0])
    assert torch.allclose(v.norm(), torch.tensor(1.0))
    assert (gap(x + v) > gap(x)).all() and (gap(x - v) < gap(x)).all()


def test_control_labels_fixed_per_type_and_position():
    tok = np.array([5, 5, 6, 5, 7] * 200)
    pos = np.array([3, 3, 3, 4, 3] * 200)
    c = control_labels(tok, pos, 2, seed=0)
    assert c[0] == c[1] and (c[::5] == c[0]).all()  # same pair, same label
    big = control_labels(np.arange(5000) % 50, np.arange(5000) // 50, 2, seed=0)
    assert 0.45 < big.mean() < 0.55  # balanced over many pairs
    assert (big != control_labels(np.arange(5000) % 50, np.arange(5000) // 50, 2, seed=1)).mean() > 0.4


def test_position_mask_and_folds_by_hand():
    ex = get_task("coinflip", rendering="toy").example(seed=1, n_events=2)
    lab = row_labels(ex, ex.labels(toy_tokenizer()), 0)
    words = ex.text.split()  # "A coin is X . N1 v1 . N2 v2 . State ? ans"
    after = position_mask(lab, "after_first_event")
    assert [w for w, m in zip(words, after, strict=True) if m] == words[7:-1]  # from the first event's "."
    assert [i for i, m in enumerate(position_mask(lab, "boundary")) if m] == [7, 10]
    assert [words[i] for i, m in enumerate(position_mask(lab, "last")) if m] == ["?"]  # not the answer word
    groups = np.repeat(np.arange(10), 7)
    for train, test in prompt_folds(groups, 5):
        assert not set(groups[train]) & set(groups[test])
    assert majority_accuracy(np.array([1, 1, 0]), np.array([1, 0])) == 0.5


def write_synthetic_store(path, n_prompts=60, T=10, d=8, seed=0):
    """A store by hand: layer 1 encodes the state, the embedding encodes only noise."""
    rng = np.random.default_rng(seed)
    store = ActivationStore.create(path, {"config": {"seed": seed}, "model": {"id": "synthetic"},
                                          "hooks": [EMBED_HOOK, "blocks.0.hook_resid_post"],
                                          "n_prompts": n_prompts, "state_names": ["heads", "tails"]})
    for p in range(n_prompts):
        state = rng.integers(0, 2, T)
        lab = {k: np.zeros(T, dtype=np.int64) for k in LABEL_NAMES}
        lab.update(state=state, parity=state, position=np.arange(T), prompt_id=np.full(T, p),
                   token_id=rng.integers(3, 20, T), events_so_far=np.arange(T) // 3,
                   n_events=np.full(T, 3), in_prompt=np.ones(T, dtype=np.int64))
        emb = torch.randn(T, d, dtype=torch.float64)
        sig = torch.randn(T, d, dtype=torch.float64)
        sig[:, 0] += 1.5 * torch.as_tensor(2.0 * state - 1)
        store.write_shard(0, {EMBED_HOOK: emb.float(), "blocks.0.hook_resid_post": sig.float()}, lab, [(p, T)])
    return store.finalize()


def test_report_accuracy_equals_sklearn_group_kfold(tmp_path):
    torch.manual_seed(0)
    store = write_synthetic_store(str(tmp_path / "s"))
    cfg = ReportConfig(label="state", folds=4, trainer="sklearn")
    rep = probe_report(ActivationStore.open(store.path), cfg, out=str(tmp_path / "p"))
    lab = store.load_labels()
    rows = position_mask(lab, "after_first_event")
    order = np.lexsort((lab["position"][rows], lab["prompt_id"][rows]))
    X = store.load_hook("blocks.0.hook_resid_post", rows=rows).numpy()[order]
    y, g = lab["state"][rows][order], lab["prompt_id"][rows][order]
    folds = list(GroupKFold(n_splits=4).split(X, groups=g))
    from sklearn.pipeline import make_pipeline

    ref = cross_val_predict(make_pipeline(StandardScaler(), LogisticRegression(C=1.0)), X, y, cv=folds)
    assert rep.layers[0]["accuracy"] == pytest.approx(float((ref == y).mean()), abs=0.005)
    assert rep.layers[0]["accuracy"] > 0.85 and rep.embedding_accuracy < 0.65
    assert rep.best_layer == 0 and rep.n_prompts == 60
    probe = LinearProbe.load(str(tmp_path / "p"))
    assert probe.meta["store_hash"] == store.hash and probe.hooks == store.hooks
    with pytest.raises(KeyError, match="label 'colour' does not exist"):
        probe_report(store, ReportConfig(label="colour"))
    torch_rep = probe_report(store, ReportConfig(label="state", folds=4, trainer="torch"))
    assert abs(torch_rep.layers[0]["accuracy"] - rep.layers[0]["accuracy"]) <= 0.01
