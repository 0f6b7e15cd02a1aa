"""Probes: torch trainer vs scikit-learn, streaming vs in-memory, position classes, save/load,
controls and splits, and the report's CV accuracy against scikit-learn's GroupKFold."""

import numpy as np
import pytest
import torch
from beliefscope.models.tokenizer import toy_tokenizer
from beliefscope.probes.controls import control_labels, majority_accuracy, position_mask, prompt_folds
from beliefscope.probes.harvest import EMBED_HOOK, row_labels
from beliefscope.probes.linear import LinearProbe, fit_all_layers
from beliefscope.probes.report import ReportConfig, probe_report
from beliefscope.probes.store import LABEL_NAMES, ActivationStore
from beliefscope.tasks import get_task
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold, cross_val_predict
from sklearn.preprocessing import StandardScaler


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


def test_streaming_chunks_equal_in_memory():
    X, y = synthetic()
    full = fit_all_layers(X, y, trainer="torch")
    parts = [(X[:, s], y[s], torch.zeros(len(y[s]), dtype=torch.long))
             for s in (slice(0, 400), slice(400, 1100), slice(1100, None))]
    streamed = fit_all_layers(lambda: iter(parts), trainer="torch", n_classes=2)
    torch.testing.assert_close(streamed.mean, full.mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(streamed.W, full.W, atol=1e-3, rtol=1e-3)


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
