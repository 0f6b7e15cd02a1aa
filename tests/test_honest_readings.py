"""Honest readings: group-bootstrap intervals, cross-fitted baselines (last-named class, bag-of-words, any label),
controls only where defined, and verdicts against the strongest baseline, each against a hand computation or
scikit-learn, and end to end on the shipped locations records (harvest -> probe)."""

import json
import os

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold

from beliefscope.cli import main as cli
from beliefscope.probes.baselines import control_defined, lookup_baseline, prefix_counts, text_so_far_baseline
from beliefscope.probes.honest import layer_reading, verdict
from beliefscope.probes.intervals import group_interval, margin_interval
from beliefscope.tasks.surface import last_named

from .tiny_llama import tiny_llama_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tasks", "data", "locations.jsonl")


def test_interval_counts_groups_not_rows():
    """20 groups of 10 identical rows carry 20 draws of information, not 200: the interval must be as wide as
    20 independent rows' (normal approximation), not as narrow as 200's."""
    rng = np.random.default_rng(3)
    per_group = rng.random(20) < 0.6
    correct, groups = np.repeat(per_group, 10).astype(float), np.repeat(np.arange(20), 10)
    p = correct.mean()
    lo, hi = group_interval(correct, groups, n_boot=4000)
    want = 2 * 1.96 * np.sqrt(p * (1 - p) / 20)
    assert 0.75 * want <= hi - lo <= 1.25 * want
    assert hi - lo > 2 * (2 * 1.96 * np.sqrt(p * (1 - p) / 200))


def test_margin_of_a_scorer_over_itself_is_exactly_zero_and_pairing_narrows():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 5)
    a = (rng.random(200) < 0.7).astype(float)
    assert margin_interval(a, a, groups) == (0.0, 0.0, 0.0)
    b = a.copy()
    b[:10] = 1 - b[:10]  # b differs from a on 10 rows of 2 groups
    m, lo, hi = margin_interval(a, b, groups)
    alo, ahi = group_interval(a, groups)
    assert m == pytest.approx(a.mean() - b.mean()) and hi - lo < (ahi - alo) / 2  # shared noise cancels


def test_last_named_by_hand():
    text = "The key is in the Hall. Ada walks down the hallway. She puts it in the den, not the hall."
    ends = np.array([3, 23, 51, 77, 89])
    # "hallway" is not "hall"; case is ignored; the den then the hall
    assert last_named(text, ["den", "hall"], ends).tolist() == [-1, 1, 1, 0, 1]
    assert last_named(text, ["attic"], ends).tolist() == [-1] * 5


def test_lookup_baseline_is_cross_fitted():
    feat = np.array([0, 0, 0, 1, 1, 1, 0, 1])
    y = np.array([1, 1, 0, 0, 0, 1, 1, 0])
    folds = [(np.arange(4, 8), np.arange(0, 4)), (np.arange(0, 4), np.arange(4, 8))]
    # fold 1 trains on rows 4-7: value 0 -> 1 (row 6), value 1 -> 0 (rows 5 and 7 -> 1, 0: tie -> the lower class)
    # fold 2 trains on rows 0-3: value 0 -> 1 (two 1s, one 0); value 1 -> 0
    assert lookup_baseline(feat, y, folds).tolist() == [1, 1, 1, 0, 0, 0, 1, 0]


def test_text_so_far_equals_scikit_learn_on_the_same_folds():
    rng = np.random.default_rng(1)
    n_prompts, T, V = 60, 6, 12
    token_id = rng.integers(0, V, size=(n_prompts, T))
    prompt_id = np.repeat(np.arange(n_prompts), T)
    position = np.tile(np.arange(T), n_prompts)
    y_prompt = (token_id == 3).any(1).astype(int)  # the label: did word 3 occur
    at = position == T - 1  # scored at each text's last token
    counts = prefix_counts(token_id.ravel(), prompt_id, position, prompt_id[at], position[at])
    dense = np.zeros((n_prompts, V))
    for p in range(n_prompts):
        for t in token_id[p]:
            dense[p, t] += 1
    np.testing.assert_array_equal(counts.toarray()[:, :V], dense)
    folds = list(GroupKFold(5).split(dense, groups=np.arange(n_prompts)))
    ours = text_so_far_baseline(counts, y_prompt, folds)
    ref = np.zeros(n_prompts, dtype=int)
    for tr, te in folds:
        ref[te] = LogisticRegression(C=1.0, max_iter=2000).fit(np.log1p(dense[tr]), y_prompt[tr]).predict(
            np.log1p(dense[te]))
    np.testing.assert_array_equal(ours, ref)
    assert (ours == y_prompt).mean() > 0.9


def test_control_is_left_out_where_every_scored_token_is_one_type():
    pos = np.arange(200) % 40
    assert control_defined(np.full(200, 7), pos)[0] is False
    assert "1.0 effective word types" in control_defined(np.full(200, 7), pos)[1]
    assert control_defined(np.arange(200) % 3, np.full(200, 5))[0] is False  # 3 keys: a random class is a coin
    assert control_defined(np.arange(200) % 50, pos)[0] is True


def test_verdict_reads_the_strongest_baseline_and_flags_below_chance():
    groups = np.repeat(np.arange(60), 4)
    rng = np.random.default_rng(2)
    probe = rng.random(240) < 0.41
    bases = {"majority": rng.random(240) < 0.24, "last_named": rng.random(240) < 0.40}
    row = {"hook": "blocks.2.hook_resid_post", "accuracy": round(float(probe.mean()), 4),
           **layer_reading(probe, bases, groups, chance=0.2)}
    assert row["strongest_baseline"] == "last_named"
    text = verdict(row, "box", 60, 0.2)
    assert "no evidence beyond the class named last so far" in text and "blocks.2" in text
    low = rng.random(240) < 0.15
    row2 = {"hook": "blocks.9.hook_resid_post", "accuracy": float(low.mean()),
            **layer_reading(low, {"majority": rng.random(240) < 0.5}, groups, chance=0.5)}
    assert row2["below_chance"] and "below chance" in verdict(row2, "truth", 60, 0.5)


@pytest.fixture(scope="module")
def locations(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("honest")
    texts = [json.loads(line)["text"] for line in open(DATA)]
    model = tiny_llama_folder(str(tmp / "tiny"), texts)
    acts = str(tmp / "acts")
    assert cli(["harvest", "--model", model, "--data", DATA, "--events-field", "location", "--label-field", "negated",
                "--out", acts, "--quiet"]) == 0
    return tmp, acts


def _report(capsys, acts, *more) -> dict:
    capsys.readouterr()
    assert cli(["probe", "--acts", acts, *more, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_names_the_strongest_baseline_on_own_records(locations, capsys):
    """Before: the report measured the probe against chance and the majority only. The objects of the shipped
    records move to named rooms, so "the room named last" is right most of the time; the report must score it
    (cross-fitted, equal to the rule computed here by hand) and read the verdict against it."""
    from beliefscope.probes.store import ActivationStore

    _, acts = locations
    rep = _report(capsys, acts, "--label", "location", "--baseline-label", "negated")
    assert rep["scored_on"] == "out-of-fold" and rep["n_groups"] == 160
    base = rep["baselines"]
    assert {"majority", "last_named", "text_so_far", "embedding", "label:negated"} <= set(base)
    lab = ActivationStore.open(acts).load_labels()
    rows = (lab["location"] >= 0) & (lab["template_split"] == 0) & (lab["in_prompt"] == 1)
    direct = float(np.mean(lab["location_last_named"][rows] == lab["location"][rows]))
    # the cross-fitted rule maps each named room to itself (the names are the classes), so it equals the raw rule
    assert base["last_named"]["accuracy"] == pytest.approx(direct, abs=1e-4)
    lo, hi = base["last_named"]["interval"]
    assert lo < base["last_named"]["accuracy"] < hi and base["last_named"]["n_groups"] == 160
    for r in rep["layers"]:
        assert r["strongest_baseline"] in base or r["strongest_baseline"] == "random_init"
        assert r["accuracy_interval"][0] <= r["accuracy"] <= r["accuracy_interval"][1]
    assert "class named last so far" in rep["verdict"] and "out-of-fold" in rep["verdict"]


def test_control_left_out_at_the_last_token(locations, capsys):
    """Before: a per-text label scored at each text's final "." drew a control bar from one word type."""
    _, acts = locations
    rep = _report(capsys, acts, "--label", "negated")
    assert rep["control"]["defined"] is False and "effective word types" in rep["control"]["note"]
    assert all(r["control_accuracy"] is None and r["selectivity"] is None for r in rep["layers"])
    assert rep["baselines"]["text_so_far"]["accuracy"] > rep["baselines"]["majority"]["accuracy"]


def test_baseline_label_that_is_not_in_the_store_is_refused(locations, capsys):
    _, acts = locations
    assert cli(["probe", "--acts", acts, "--label", "location", "--baseline-label", "lastbox", "--quiet"]) == 2
    assert "--baseline-label 'lastbox' is not a label" in capsys.readouterr().err


def test_probe_folder_maps_each_training_text_to_the_fold_that_held_it_out(locations, capsys):
    """`forced` reads a training record with the fold probe that never saw it: crossfit.json must send every
    training text to exactly the fold whose test rows hold it, and that fold's probe must equal its refit."""
    import torch

    from beliefscope.probes.controls import prompt_folds
    from beliefscope.probes.crossfit import CrossFitted
    from beliefscope.probes.linear import fit_all_layers
    from beliefscope.probes.store import ActivationStore
    from beliefscope.tasks.records import load_data

    tmp, acts = locations
    out = str(tmp / "probes")
    rep = _report(capsys, acts, "--label", "location", "--out", out)
    assert rep["files"] == [os.path.join(out, "probe-layers.png")] and os.path.getsize(rep["files"][0]) > 10_000
    cf = CrossFitted.load(out)
    data = load_data(DATA, events_field=("location",), label_field=("negated",))
    train = [r for r in data.records if not r.heldout]
    assert len(cf.folds) == 5 and len(cf.text_fold) == len(train)
    assert cf.for_text([r for r in data.records if r.heldout][0].text) == (cf.final, "held-out")
    store = ActivationStore.open(acts)
    lab = store.load_labels()
    rows = np.nonzero((lab["location"] >= 0) & (lab["template_split"] == 0) & (lab["in_prompt"] == 1))[0]
    rows = rows[np.lexsort((lab["position"][rows], lab["prompt_id"][rows]))]
    folds = prompt_folds(lab["group_id"][rows], 5)
    for k, (tr, te) in enumerate(folds):
        for p in np.unique(lab["prompt_id"][rows[te]]):
            probe, how = cf.for_text(data.records[int(p)].text)
            assert how == "out-of-fold" and probe is cf.folds[k]
    # fold 0's probe is the probe fitted on fold 0's training rows alone (scikit-learn's objective, any trainer)
    h = "blocks.1.hook_resid_post"
    X = store.load_hook(h)[torch.as_tensor(rows)]  # [n, d]
    tr0 = folds[0][0]
    ref = fit_all_layers(X[None, tr0], torch.as_tensor(lab["location"][rows[tr0]]), hooks=[h], trainer="sklearn")
    agree = (cf.folds[0].predict(X, h) == ref.predict(X, h)).float().mean()
    assert agree > 0.98


def test_a_question_per_record_from_its_field_or_a_template():
    """Before: one --question for every record, and text after the last event was put before the question."""
    from beliefscope.analyses.forced import split_story
    from beliefscope.tasks.records import load_data

    recs = [{"text": "The key is in Box A. Move it to Box B. Tom waves.", "object": "key",
             "events": [{"end": 20, "state": "A"}, {"end": 38, "state": "B"}], "question": " Where is the key?"},
            {"text": "The pen is in Box B. Ann sings.", "object": "pen", "events": [{"end": 20, "state": "B"}],
             "question": " Where is the pen?"}]
    data = load_data(recs)
    assert data.has_questions()
    ex = data.example(0, "events")
    assert ex.meta["question"] == " Where is the key?" and ex.prompt.endswith("Tom waves. Where is the key?")
    # the text after the last event stays in the story; the question is the record's own, not "Tom waves. Where..."
    assert split_story(ex) == ("The key is in Box A. Move it to Box B. Tom waves.", " Where is the key?")
    assert data.example(1, "events", question=" Is the {object} in Box B?").meta["question"] == " Is the pen in Box B?"
    with pytest.raises(ValueError, match=r"names the field 'colour', which record 0 \(id 0\) lacks; its fields are"):
        data.example(0, "events", question=" Is it {colour}?")
    assert not load_data([{k: v for k, v in recs[0].items() if k != "question"}]).has_questions()


def test_shipped_tracking_stories_have_a_strong_but_imperfect_last_named_baseline():
    """The entity-tracking set moves other objects between boxes, so the box named last is often not the
    watched object's: the surface baseline a probe must beat, neither trivial nor perfect."""
    from beliefscope.tasks.records import example_path, load_data

    data = load_data(example_path("tracking.jsonl"), events_field=("box",))
    assert len(data) == 200 and data.classes["box"] == ["A", "B", "C", "D", "E"] and data.has_questions()
    hits = n = 0
    for r in data.records:
        for end, c in r.tracks["box"].items:
            hits += int(last_named(r.text, data.classes["box"], np.array([end]))[0] == c)
            n += 1
    assert 0.3 < hits / n < 0.8, hits / n


def test_python_folds_equal_the_command_line(tmp_path, capsys):
    """Before: `hook_xy` grouped rows by prompt while `probe` grouped them by the data's group field (0.903 vs
    0.921 on a researcher's cities). Now both give the same rows, groups and folds, so the same accuracy."""
    from sklearn.model_selection import cross_val_predict

    from beliefscope.probes import ActivationStore, ProbeClassifier, hook_xy

    recs = [json.loads(line) for line in open(DATA)][:120]
    for i, r in enumerate(recs):
        r["group"] = f"g{i // 4}"  # four records per group
    path = tmp_path / "grouped.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    model = tiny_llama_folder(str(tmp_path / "tiny"), [r["text"] for r in recs])
    acts = str(tmp_path / "acts")
    assert cli(["harvest", "--model", model, "--data", str(path), "--events-field", "location", "--out", acts,
                "--no-random-init", "--quiet"]) == 0
    rep = _report(capsys, acts, "--label", "location", "--trainer", "sklearn", "--no-text-baseline")
    h = "blocks.1.hook_resid_post"
    X, y, groups = hook_xy(ActivationStore.open(acts), h, "location")
    n_train_groups = len({r["group"] for r in recs if r["split"] == "train"})
    assert len(np.unique(groups)) == n_train_groups == rep["n_groups"] and len(y) == rep["n_rows"]
    pred = cross_val_predict(ProbeClassifier(trainer="sklearn"), X, y, groups=groups, cv=GroupKFold(5))
    row = next(r for r in rep["layers"] if r["hook"] == h)
    assert float(np.mean(pred == y)) == pytest.approx(row["accuracy"], abs=1e-3)


def test_mass_mean_by_hand_and_cross_fitted():
    """Marks & Tegmark's mass-mean probe: the mean difference thresholded half way, fitted on the training fold."""
    from beliefscope.probes.massmean import mass_mean_oof

    rng = np.random.default_rng(4)
    X = rng.normal(size=(1, 80, 5)).astype(np.float32)
    y = (X[0, :, 0] + 0.3 * rng.normal(size=80) > 0).astype(int)
    folds = list(GroupKFold(4).split(X[0], groups=np.arange(80) // 2))
    ours = mass_mean_oof(X, y, folds, 2)[0]
    hand = np.zeros(80, dtype=int)
    for tr, te in folds:
        m0, m1 = X[0, tr][y[tr] == 0].mean(0), X[0, tr][y[tr] == 1].mean(0)
        hand[te] = ((X[0, te] - (m0 + m1) / 2) @ (m1 - m0) > 0).astype(int)
    np.testing.assert_array_equal(ours, hand)
    three = (X[0, :, 0] > 0.5).astype(int) + (X[0, :, 0] > -0.5)
    assert (mass_mean_oof(X, three, folds, 3)[0] == three).mean() > 0.6


@pytest.fixture(scope="module")
def truth_stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("truth")
    paths = {n: os.path.join(ROOT, "tasks", "data", f"{n}.jsonl") for n in ("cities", "cities_negated")}
    texts = [json.loads(line)["text"] for p in paths.values() for line in open(p)]
    model = tiny_llama_folder(str(tmp / "tiny"), texts)
    stores = {}
    for n, p in paths.items():
        stores[n] = str(tmp / n)
        assert cli(["harvest", "--model", model, "--data", p, "--label-field", "truth", "--out", stores[n],
                    "--no-random-init", "--quiet"]) == 0
    return stores


def test_transfer_reads_the_final_probe_on_another_store(truth_stores, tmp_path, capsys):
    """Fitted on the cities, read on the negated cities (no union harvested): equal to the saved final probe read
    on the other store's rows by hand; the mass-mean probe sits beside the logistic one in every row."""
    import torch

    from beliefscope.probes.linear import LinearProbe
    from beliefscope.probes.store import ActivationStore

    out = str(tmp_path / "p")
    rep = _report(capsys, truth_stores["cities"], "--label", "truth", "--transfer", truth_stores["cities_negated"],
                  "--out", out)
    t = rep["transfer"][truth_stores["cities_negated"]]
    assert t["n_rows"] == 500 and t["n_groups"] == 250 and all("mass_mean_accuracy" in r for r in rep["layers"])
    probe = LinearProbe.load(out)
    other = ActivationStore.open(truth_stores["cities_negated"])
    lab = other.load_labels()
    rows = lab["truth"] >= 0
    for r in t["layers"]:
        X = other.load_hook(r["hook"])[torch.as_tensor(rows)]
        assert r["accuracy"] == pytest.approx(probe.accuracy(X, lab["truth"][rows], r["hook"]), abs=1e-4)
    # another model's store, or a store without the label, is refused before any fit
    assert cli(["probe", "--acts", truth_stores["cities"], "--label", "truth", "--transfer", "/nonexistent",
                "--quiet"]) == 2


def test_instrument_reads_the_store_and_its_probes(locations, tmp_path, capsys):
    """Before: the instrument ran the model over every record again (18 min on 240 stories) and had no --n. With
    --acts its probe numbers are the probe report's (out-of-fold, with the strongest baseline), only forced answers
    run the model, on --n records, each read by the fold probe that did not see it; one layer naming throughout."""
    _, acts = locations
    out = str(tmp_path / "p")
    rep = _report(capsys, acts, "--label", "location", "--out", out)
    capsys.readouterr()
    assert cli(["instrument", "--acts", acts, "--probes", out, "--question", " Where is it now? It is in the", "--n",
                "8", "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    (name, m), = res["models"].items()
    best = next(r for r in rep["layers"] if r["layer"] == rep["best_layer"])
    assert m["hook"] == best["hook"] == f"blocks.{m['best_layer']}.hook_resid_post"
    assert res["config"]["n_records"] == 8 and sum(m["bands"]["all"]["scored_on"].values()) == 8
    assert [r["accuracy"] for r in m["probe_layers"]] == [r["accuracy"] for r in rep["layers"]]
    assert "class named last so far" in m["verdict"] and "chance" in m["verdict"]
    # probes of another store, or a --label other than the probes', are refused before any model loads
    assert cli(["instrument", "--acts", acts, "--probes", out, "--label", "negated", "--question", " Q",
                "--quiet"]) == 2
    assert "--label 'negated', but the probes" in capsys.readouterr().err


def test_multiclass_forced_figure_shows_the_true_class_against_one_in_k():
    """Before: `forced`'s example plot drew P(first class) alone for 5 classes, against a chance line at 0.5."""
    from beliefscope.analyses import plots

    fig = plots.forced_vs_probe([3, 7, 9], np.array([0.5, 0.1, 0.3]), np.array([0.4, 0.2, 0.9]), None, chance=0.2)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "P(true class)"
    assert [round(float(line.get_ydata()[0]), 3) for line in ax.get_lines()] == [0.2]  # the chance line alone
    fig2 = plots.agreement_by_event([1, 2], [0.3, 0.4], [0.5, 0.5], [0.2, 0.3], chance=0.2)
    assert 0.2 in [round(float(line.get_ydata()[0]), 3) for line in fig2.axes[0].get_lines()]


def test_view_without_a_question_leaves_the_forced_row_out(locations, tmp_path, capsys):
    """Before: `view --data` refused to run without --question."""
    tmp, acts = locations
    out = str(tmp_path / "p")
    _report(capsys, acts, "--label", "location", "--out", out)
    model = str(tmp / "tiny")
    capsys.readouterr()
    assert cli(["view", "--model", model, "--probes", out, "--data", DATA, "--events-field", "location", "--n", "2",
                "--out", str(tmp_path / "v.html"), "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    html = open(tmp_path / "v.html").read()
    assert res["n_stories"] == 2 and '"forced"' not in html and '"scored_on"' in html


def test_beliefs_json_gives_truth_exactly_where_it_scores(tmp_path, capsys):
    """Before: `beliefs --task cups --json` gave `truth` at every position but scored `accuracy_at_layer` on the
    tokens from the first event on, so the JSON could not reproduce it."""
    acts, probes = str(tmp_path / "acts"), str(tmp_path / "probes")
    assert cli(["harvest", "--model", "direct-cups", "--task", "cups", "--n", "60", "--out", acts,
                "--no-random-init", "--quiet"]) == 0
    assert cli(["probe", "--acts", acts, "--out", probes, "--no-text-baseline", "--quiet"]) == 0
    capsys.readouterr()
    prompt = ("A ball is under right . Alice swaps left right . Heidi swaps middle right . Bob swaps middle right . "
              "Where ?")
    assert cli(["beliefs", "--model", "direct-cups", "--probes", probes, "--task", "cups", "--prompt", prompt,
                "--out", str(tmp_path / "b.png"), "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    pos = [p for p in res["positions"] if "truth" in p]
    first = res["event_boundaries"][0]
    assert len(pos) == res["scored_tokens"] == len(res["positions"]) - first
    def top(p):  # the argmax of the rounded distribution, or the unrounded one's where rounding tied
        q = sorted(p["p"])
        return res["state_names"][int(np.argmax(p["p"]))] if q[-1] > q[-2] else p["pred"]

    hand = np.mean([top(p) == p["truth"] for p in pos])
    assert res["accuracy_at_layer"] == pytest.approx(hand, abs=1e-4)


def test_long_trajectories_stay_readable_and_mark_events():
    """Before: the beliefs line plot had no event marks and a 100-token story drew a 3,935 px wide PNG."""
    from beliefscope.analyses import plots

    T = 300
    p = np.full((T, 3), 1 / 3)
    fig = plots.class_lines(p, [f"t{i}" for i in range(T)], np.zeros(T, dtype=int), ["a", "b", "c"],
                            ["#111111", "#222222", "#333333"], 5, boundaries=[10, 50, 90],
                            forced=np.full((3, 3), 1 / 3), forced_positions=[10, 50, 90])
    assert fig.get_figwidth() <= plots.MAX_WIDTH and len(fig.axes[0].get_xticks()) <= plots.MAX_TOKEN_LABELS
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "event ends" in labels and "forced P(a)" in labels


def test_one_name_per_label_on_own_records(locations, capsys):
    """Before: `probe --label state` took the records' first label while `instrument --label state` refused it."""
    _, acts = locations
    rep = _report(capsys, acts, "--no-text-baseline")  # no --label: the records' first label, by its own name
    assert rep["label"] == "location"
    for argv in (["probe", "--acts", acts, "--label", "state"],):
        assert cli([*argv, "--quiet"]) == 2
        assert "'state' is not a label of your records" in capsys.readouterr().err


def test_a_text_that_ends_in_its_question_is_read_at_its_end(tmp_path, capsys):
    """A per-text label with no --question (Kim & Schuster's boxes: "... Box 0 contains") is read as the model's
    next word at the text's last token: equal to the HF model's own logits there, over the answer words."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [{"sentence": f"Box 0 contains the {a}. Box 1 contains the {b}. Box {k} contains <extra_id_0> .",
             "masked_content": f"<extra_id_0> the {[a, b][k]}", "numops": i % 3}
            for i, (a, b, k) in enumerate([("car", "bike", 0), ("bike", "car", 1), ("car", "bike", 1),
                                            ("bike", "car", 0)] * 3)]
    path = tmp_path / "boxes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_llama_folder(str(tmp_path / "tiny"), [r["sentence"] for r in rows])
    capsys.readouterr()
    classes = sorted({r["masked_content"].replace("<extra_id_0>", "").strip() for r in rows})  # the label's
    words = [c.split()[-1] for c in classes]  # one answer word per class, in class order: bike, car
    assert cli(["forced", "--model", model, "--data", str(path), "--format", "boxes", "--answers", ",".join(words),
                "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    hf, tok = AutoModelForCausalLM.from_pretrained(model).eval(), AutoTokenizer.from_pretrained(model)
    ans = [tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in words]
    hits = []
    for r in rows:
        text = r["sentence"].split("<extra_id_0>")[0].rstrip()
        with torch.no_grad():
            logits = hf(torch.tensor([tok(text)["input_ids"]])).logits[0, -1]
        truth = classes.index(r["masked_content"].replace("<extra_id_0>", "").strip())
        hits.append(int(logits[ans].argmax()) == truth)
    assert 0 < np.mean(hits) < 1  # the check tells the classes apart
    assert res["n_boundaries"] == len(rows) and res["forced_accuracy"] == pytest.approx(np.mean(hits), abs=1e-6)


def test_a_task_story_the_probe_was_fitted_on_is_read_out_of_fold(tmp_path, capsys):
    """Task stores remember their stories too: `beliefs` on a harvested story reads it with the fold probe that
    did not see it, and on a new story with the final probe, and says which."""
    from dataclasses import fields

    from beliefscope.probes.harvest import HarvestConfig, make_examples
    from beliefscope.probes.store import ActivationStore

    acts, probes = str(tmp_path / "acts"), str(tmp_path / "probes")
    assert cli(["harvest", "--model", "target", "--n", "40", "--events", "1-5", "--out", acts, "--no-random-init",
                "--quiet"]) == 0
    assert cli(["probe", "--acts", acts, "--out", probes, "--no-text-baseline", "--quiet"]) == 0
    hc = ActivationStore.open(acts).manifest["config"]
    seen = make_examples(HarvestConfig(**{f.name: hc[f.name] for f in fields(HarvestConfig) if f.name in hc}))[3]
    for prompt, how in ((seen.prompt, "out-of-fold"),
                        ("A coin's state is heads. Alice flips the coin. Bob flips the coin. Carol flips the coin. "
                         "Dave flips the coin. Erin flips the coin. Frank flips the coin. What's the state? A:", None)):
        capsys.readouterr()
        assert cli(["beliefs", "--model", "target", "--probes", probes, "--task", "coinflip", "--prompt", prompt,
                    "--out", str(tmp_path / "b.png"), "--json", "--quiet"]) == 0
        got = json.loads(capsys.readouterr().out)["scored_on"]
        assert got == how or (how is None and got == "held-out"), (prompt, got)


def test_python_trajectory_reads_a_training_record_out_of_fold(locations, tmp_path, capsys):
    """In Python as on the command line: a probe loaded from its folder reads a record it was fitted on with the fold
    probe that did not see it; a probe fitted in memory says nothing it cannot know."""
    from beliefscope.analyses.beliefs import trajectory
    from beliefscope.models.load import load_model
    from beliefscope.probes.linear import LinearProbe
    from beliefscope.tasks.records import load_data

    tmp, acts = locations
    out = str(tmp_path / "p")
    _report(capsys, acts, "--label", "location", "--out", out)
    bridge, tok = load_model(str(tmp / "tiny"))
    data = load_data(DATA, events_field=("location",), label_field=("negated",))
    train_i = next(i for i, r in enumerate(data.records) if not r.heldout)
    probe = LinearProbe.load(out)
    assert trajectory(bridge, tok, probe, data.example(train_i, "location")).scored_on == "out-of-fold"
    held_i = next(i for i, r in enumerate(data.records) if r.heldout)
    assert trajectory(bridge, tok, probe, data.example(held_i, "location")).scored_on == "held-out"
    probe.folder = ""  # as if fitted in memory
    assert trajectory(bridge, tok, probe, data.example(train_i, "location")).scored_on is None
