"""ProbeClassifier: scikit-learn's own estimator checks, and cross_val_score / GridSearchCV / Pipeline
on a stored harvest of the toy target, against LogisticRegression on standardised activations and
against fit_all_layers on the same layer."""

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, GroupKFold, GroupShuffleSplit, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from beliefscope.probes import ActivationStore, ProbeClassifier, fit_all_layers, harvest, hook_xy

pytestmark = pytest.mark.usefixtures("one_thread")

HOOK = "blocks.3.hook_resid_post"


@parametrize_with_checks([ProbeClassifier(), ProbeClassifier(trainer="sklearn")])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def store(target, tmp_path_factory):
    """A small harvest of the shipped toy target (resid_post of every layer), written and reopened."""
    from beliefscope.tasks import get_task

    bridge, tok = target
    exs = get_task("coinflip", rendering="toy").examples(48, seed=11, events="1-6")
    out = str(tmp_path_factory.mktemp("acts") / "target")
    harvest(bridge, tok, exs, "resid_post", "all", out, config={"n": 48, "seed": 11}, batch_size=8, shard_rows=300)
    return ActivationStore.open(out)


@pytest.fixture(scope="module")
def xyg(store):
    X, y, groups = hook_xy(store, HOOK, "state")
    assert X.ndim == 2 and X.shape[0] == len(y) == len(groups) and len(np.unique(groups)) == 48
    return X, y, groups


def reference(C=1.0):
    """The same objective in scikit-learn: logistic regression on standardised activations."""
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=3000, tol=1e-6))


def test_hook_xy_reads_the_store_rows(store, xyg):
    X, y, groups = xyg
    lab = store.load_labels()
    rows = np.nonzero(lab["in_prompt"].astype(bool) & (lab["events_so_far"] >= 1))[0]  # prompt tokens after event 1
    rows = rows[np.lexsort((lab["position"][rows], lab["prompt_id"][rows]))]  # sorted by (prompt, position)
    np.testing.assert_array_equal(X, store.load_hook(HOOK).numpy()[rows])
    np.testing.assert_array_equal(y, lab["state"][rows])
    np.testing.assert_array_equal(groups, lab["prompt_id"][rows])
    with pytest.raises(KeyError, match="is not in store"):
        hook_xy(store, "blocks.9.hook_resid_post", "state")
    with pytest.raises(KeyError, match="does not exist"):
        hook_xy(store, HOOK, "mood")


def test_agrees_with_fit_all_layers_on_the_same_layer(store, xyg):
    X, y, groups = xyg
    train, test = next(GroupShuffleSplit(n_splits=1, test_size=0.3, random_state=0).split(X, y, groups))
    clf = ProbeClassifier(hook=HOOK).fit(X[train], y[train])
    layers = [h for h in store.hooks if h.endswith("resid_post")]
    Xl = torch.stack([torch.as_tensor(hook_xy(store, h, "state")[0]) for h in layers])  # [L, n, d]
    fast = fit_all_layers(Xl[:, train], torch.as_tensor(y[train]), hooks=layers)
    acc_fast = fast.accuracy(Xl[layers.index(HOOK), test], torch.as_tensor(y[test]), HOOK)
    acc_clf = clf.score(X[test], y[test])
    assert abs(acc_clf - acc_fast) <= 0.01, (acc_clf, acc_fast)
    assert clf.to_probe().hooks == [HOOK]


def test_cross_val_score_matches_logistic_regression(xyg):
    X, y, groups = xyg
    cv = GroupKFold(n_splits=4)
    ours = cross_val_score(ProbeClassifier(C=1.0), X, y, groups=groups, cv=cv)
    ref = cross_val_score(reference(1.0), X, y, groups=groups, cv=cv)
    assert np.abs(ours - ref).max() <= 0.01, (ours, ref)
    assert ours.mean() > 0.55  # above chance: the state is partly readable after the first event


def test_grid_search_over_C_matches_logistic_regression(xyg):
    X, y, groups = xyg
    grid = [0.001, 0.1, 10.0]
    cv = GroupKFold(n_splits=3)
    ours = GridSearchCV(ProbeClassifier(), param_grid={"C": grid}, cv=cv).fit(X, y, groups=groups)
    ref = GridSearchCV(reference(), param_grid={"logisticregression__C": grid}, cv=cv).fit(X, y, groups=groups)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], atol=0.01)
    assert ours.best_params_["C"] == ref.best_params_["logisticregression__C"]


def test_in_a_pipeline(xyg):
    X, y, groups = xyg
    cv = GroupKFold(n_splits=3)
    ours = cross_val_score(make_pipeline(PCA(n_components=16, random_state=0), ProbeClassifier()), X, y,
                           groups=groups, cv=cv)
    ref = cross_val_score(make_pipeline(PCA(n_components=16, random_state=0), reference()), X, y,
                          groups=groups, cv=cv)
    assert np.abs(ours - ref).max() <= 0.01, (ours, ref)


def test_bad_parameters_name_the_value():
    X, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    with pytest.raises(ValueError, match=r"C=-1 must be a positive number"):
        ProbeClassifier(C=-1).fit(X, y)
    with pytest.raises(ValueError, match=r"trainer='adam' is unknown"):
        ProbeClassifier(trainer="adam").fit(X, y)
    with pytest.raises(ValueError, match="got 1 class"):
        ProbeClassifier().fit(X, np.zeros(20))
