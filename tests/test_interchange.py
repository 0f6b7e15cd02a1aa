"""Interchange interventions, DAS and LEACE erasure: the counterfactual rule against hand-computed answers, the
lazy toy target as ground truth (its state is computed at the question, whatever the event boundaries carry),
a full-rank subspace equal to the whole activation, DAS against a random subspace on held-out pairs, LEACE's
guarantee (equal class means after erasure, a refitted probe at the majority class), and every bad input refused
before any forward."""

import json
import os

import numpy as np
import pytest
import torch

from beliefscope.analyses.das import DasConfig, learn_das, split_pairs
from beliefscope.analyses.erasure import ErasureConfig, erasure
from beliefscope.analyses.interchange import interchange, prepare, sites
from beliefscope.analyses.pairs import Pair, counterfactual_state, record_pairs, task_pairs
from beliefscope.cli import main as cli
from beliefscope.hooks.names import hf_of
from beliefscope.models.load import load_model
from beliefscope.tasks import get_task, load_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCATIONS = os.path.join(ROOT, "tasks", "data", "locations.jsonl")


@pytest.fixture(scope="module")
def target():
    return load_model("target")


@pytest.fixture(scope="module")
def coin_pairs():
    return task_pairs(get_task("coinflip"), n=60, seed=0, events=(3, 6))


class Forwards:
    """Counts forwards of the HF model (a refusal must come before the first)."""

    def __init__(self, bridge):
        self.n, self.hf = 0, hf_of(bridge)

    def __enter__(self):
        self.h = self.hf.register_forward_pre_hook(lambda *a: setattr(self, "n", self.n + 1))
        return self

    def __exit__(self, *exc):
        self.h.remove()


def test_minimal_pair_differs_in_one_event_and_the_rule_flips_every_later_answer(target):
    _, tok = target
    for p in task_pairs(get_task("coinflip"), n=20, seed=1, events=(2, 5), event=1):
        kinds = [(a.kind, b.kind) for a, b in zip(p.base.events, p.source.events)]
        assert kinds[1][0] != kinds[1][1] and all(a == b for k, (a, b) in enumerate(kinds) if k != 1)
        assert p.source.final_state == 1 - p.base.final_state  # one flip more or fewer
        n = len(p.base.events)
        for done in range(2, n + 1):  # a site after the toggled event: the source's state, replayed = its answer
            assert counterfactual_state(p, done, done) == p.source.final_state
        # before it the stories agree, so the counterfactual answer is the base's own
        assert counterfactual_state(p, 1, 1) == p.base.final_state


def test_record_rule_defined_only_at_or_after_the_last_event():
    data = load_data(LOCATIONS, events_field="location")
    pairs = record_pairs(data, by="events", max_pairs=5, question=" Where is it now? It is in the")
    p = pairs[0]
    n_b, n_s = len(p.base.events), len(p.source.events)
    assert counterfactual_state(p, n_b, n_s) == p.source.final_state
    assert counterfactual_state(p, n_b - 1, n_s) is None  # no replay rule for records
    assert all(q.base.final_state != q.source.final_state for q in pairs)


def test_lazy_target_uses_the_question_not_the_boundaries(target, coin_pairs):
    """Ground truth: the toy target answers from the tokens at the question, so interchanging the whole
    residual at an event boundary moves nothing, while at the last token of the last block it moves every
    answer; a full-rank basis is the whole activation (same answers)."""
    bridge, tok = target
    site_list = sites(bridge, layers=[0, 3], positions=["event:1", "last_event", "last"])
    res = interchange(bridge, tok, coin_pairs, site_list)
    iia = {(s.layer, s.position): r["iia"]["accuracy"] for s, r in zip(site_list, res.rows)}
    assert res.base_correct == 1.0
    assert iia[(3, "last")] == 1.0 and iia[(0, "last")] == 0.0
    assert max(iia[(x, p)] for x in (0, 3) for p in ("event:1", "last_event")) == 0.0
    assert all(r["iia"]["n_rows"] == len(coin_pairs) for r in res.rows)  # event 0 toggled: every site differs
    full_rank = interchange(bridge, tok, coin_pairs, site_list, torch.eye(int(bridge.cfg.d_model)))
    assert np.array_equal(full_rank.answers, res.answers)
    none = interchange(bridge, tok, coin_pairs, site_list, "random:1")
    assert max(r["iia"]["accuracy"] for r in none.rows) <= 0.05


def test_batched_rows_equal_one_row_at_a_time(target, coin_pairs):
    """Many (pair, site) rows share a forward, each hook patching its own rows: the answers and logit shifts
    equal running each pair alone (float rounding of other batch shapes: 1e-3 on logits of ~20)."""
    bridge, tok = target
    site_list = sites(bridge, layers=[2, 3], positions=["last_event", "last"])
    both = interchange(bridge, tok, coin_pairs[:6], site_list, batch_size=24)
    for i in range(6):
        alone = interchange(bridge, tok, coin_pairs[i: i + 1], site_list, batch_size=1)
        assert np.array_equal(alone.answers[0], both.answers[i])


def test_resumed_rows_give_the_whole_story_logits_and_gradients(target, coin_pairs):
    """DAS trains on rows resumed from the bases' clean caches (`analyses.patching`): the class logits and their
    gradient in the subspace Q equal a forward over the whole story with the same patch, to float32 rounding
    (relative 1e-4 of the largest value: a few ulps through four blocks and a softmax)."""
    from beliefscope.analyses.interchange import prepare, source_activations
    from beliefscope.analyses.patching import Prefilled, last_logits_grad, patch_hooks, resumed_logits_grad

    bridge, tok = target
    for position in ("last_event", "last"):
        site = sites(bridge, layers=[2], positions=[position])[0]
        prep = prepare(tok, coin_pairs[:6], [site])
        src = source_activations(bridge, prep, [site])[:, 0]  # [6, d]
        Q = torch.linalg.qr(torch.randn(int(bridge.cfg.d_model), 2, generator=torch.Generator().manual_seed(0)))[0]
        Q.requires_grad_(True)
        starts, zeros = prep.pos_base[:, 0], np.zeros(6, dtype=np.int64)
        whole = last_logits_grad(bridge, prep.base_ids, prep.answer_ids,
                                 patch_hooks(zeros, starts, src, [site], {site: Q}))  # [6, C]
        g_whole, = torch.autograd.grad(whole.logsumexp(1).sum() - whole[:, 0].sum(), Q)
        base = Prefilled(bridge, prep.base_ids, prep.answer_ids, batch_size=4)  # two prefill chunks
        order = np.array([3, 0, 5, 1, 4, 2])  # rows drawn from both chunks, out of order
        got = resumed_logits_grad(bridge, base, order, starts[order],
                                  [prep.base_ids[i][p:] for i, p in zip(order, starts[order])],
                                  patch_hooks(zeros, zeros, src[order], [site], {site: Q}), prep.answer_ids)
        g_got, = torch.autograd.grad(got.logsumexp(1).sum() - got[:, 0].sum(), Q)
        base.close()
        torch.testing.assert_close(got, whole[order], rtol=1e-4, atol=1e-4 * float(whole.abs().max()))
        torch.testing.assert_close(g_got, g_whole, rtol=1e-4, atol=1e-4 * float(g_whole.abs().max()))


@pytest.mark.slow
def test_das_finds_the_used_direction_on_held_out_pairs(target):
    bridge, tok = target
    pairs = task_pairs(get_task("coinflip"), n=120, seed=2, events=(3, 8))
    train, test = split_pairs(pairs, 0.5, seed=0)
    assert not {p.unit for p in train} & {p.unit for p in test}
    site = sites(bridge, layers=[3], positions=["last"])[0]
    Q = learn_das(bridge, tok, train, site, DasConfig(rank=1, steps=60))
    assert Q.shape == (bridge.cfg.d_model, 1) and torch.allclose(Q.T @ Q, torch.eye(1), atol=1e-5)
    das = interchange(bridge, tok, test, [site], {site: Q}).rows[0]["iia"]
    rnd = interchange(bridge, tok, test, [site], "random:1").rows[0]["iia"]
    assert das["interval"][0] > 0.8 and rnd["interval"][1] < das["interval"][0]
    grads = [p.grad for p in bridge.parameters()]
    assert all(g is None for g in grads)  # trained through the model, nothing accumulated on it


@pytest.mark.slow
def test_leace_guarantee_and_the_answer_falls_beside_a_random_erasure(target):
    """LEACE (concept-erasure) at the answer's token of the last block: the erased activations' class means are
    equal (its guarantee, to float64 rounding), a probe refitted on them reads no better than the majority
    class, and the answer falls further than after a random erasure of equal rank."""
    from concept_erasure import LeaceFitter

    bridge, tok = target
    exs = get_task("coinflip").examples(160, 0, (1, 8))
    res = erasure(bridge, tok, exs, ErasureConfig(layer=3, positions="last"))
    assert res["rank"] == 1 and res["probe_before_erasure"]["accuracy"] > 0.95
    maj = res["majority_baseline"]
    assert res["probe_after_erasure"]["accuracy"] <= maj["interval"][1]
    assert res["drop_leace"]["interval"][0] > res["drop_random"]["interval"][1]
    X, z = torch.randn(400, 8, dtype=torch.float64), torch.randint(0, 2, (400,))
    X[z == 1] += 2.0
    er = LeaceFitter.fit(X, z[:, None].double()).eraser
    Xe = er(X)
    assert torch.allclose(Xe[z == 0].mean(0), Xe[z == 1].mean(0), atol=1e-8)


def test_bad_input_is_refused_before_any_forward(target, coin_pairs):
    bridge, tok = target
    d = int(bridge.cfg.d_model)
    rows = [{"text": ex.prompt.removesuffix(" State ?"), "question": " State ?",
             "events": [{"end": e.span[1], "state": ex.state_names[e.state_after]} for e in ex.events]}
            for ex in get_task("coinflip").examples(8, 0, (2, 4))]
    rec = record_pairs(load_data(rows), by="events")  # records in the toy vocabulary, without a replay rule
    with Forwards(bridge) as f:
        with pytest.raises(ValueError, match="no rule defines the counterfactual answer.*last_event, last"):
            interchange(bridge, tok, rec, sites(bridge, layers=[1], positions=["event:0"]))
        with pytest.raises(ValueError, match="past a story's text"):
            interchange(bridge, tok, coin_pairs, sites(bridge, layers=[1], positions=["event:9"]))
        with pytest.raises(ValueError, match=f"rank {d + 1} does not fit a residual of d_model={d}"):
            interchange(bridge, tok, coin_pairs, sites(bridge, layers=[1]), f"random:{d + 1}")
        with pytest.raises(ValueError, match="rank cannot exceed|does not fit"):
            interchange(bridge, tok, coin_pairs, sites(bridge, layers=[1]), torch.randn(d, d + 2))
        with pytest.raises(ValueError, match="out of range: this model has blocks 0..3"):
            sites(bridge, layers=[7])
        with pytest.raises(ValueError, match="position rule 'middle' is unknown"):
            sites(bridge, positions=["middle"])
        one = [ex for ex in get_task("coinflip").examples(40, 0, (1, 3)) if ex.final_state == 0
               and all(e.state_after == 0 for e in ex.events) and ex.initial == 0]
        with pytest.raises(ValueError, match="the label has one class"):
            erasure(bridge, tok, one, ErasureConfig(layer=1))
        same = [Pair(p.base, p.base, "same") for p in coin_pairs[:2]]
        with pytest.raises(ValueError, match="interchange needs records of at least two classes|every record"):
            record_pairs(load_data([{"text": "a b.", "events": [{"end": 3, "state": "x"}]},
                                    {"text": "c d.", "events": [{"end": 3, "state": "x"}]}]), by="events")
        with pytest.raises(ValueError, match="minimal pairs are drawn for the coin task only"):
            task_pairs(get_task("cups"), n=2)
    assert f.n == 0
    assert prepare(tok, same, sites(bridge, layers=[1], positions=["last"])).noop.all()  # a pair of one story


@pytest.mark.slow
def test_interchange_command_writes_json_and_heatmap(tmp_path, capsys):
    out = tmp_path / "ic"
    rc = cli(["interchange", "--model", "target", "--n", "40", "--layers", "2,3", "--das-layers", "3",
              "--das-steps", "20", "--erase-layers", "3", "--out", str(out), "--json", "--no-progress"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    on_disk = json.loads((out / "interchange.json").read_text())
    assert on_disk["sites"] == res["sites"] and (out / "interchange.png").stat().st_size > 10_000
    last3 = next(r for r in res["sites"] if r["layer"] == 3 and r["position"] == "last")
    assert last3["verdict"].startswith("readable and used") and last3["iia_das"]["accuracy"] >= 0.9
    ev = next(r for r in res["sites"] if r["layer"] == 3 and r["position"] == "last_event")
    assert ev["iia_full"]["accuracy"] == 0.0 and "used" not in ev["verdict"].split("(")[0].replace("not used", "")


@pytest.mark.slow
def test_thinking_states_written_state_moves_every_answer(capsys):
    """Ground truth: swapping a Thinking States model's written state S for the source's at any chunk after the
    stories part moves the answer to the replayed counterfactual; a random vector at the same distance does not."""
    rc = cli(["interchange", "--model", "thinking", "--n", "6", "--events", "3-5", "--json", "--no-progress"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["chunks"] and all(r["iia_swap"]["accuracy"] == 1.0 for r in res["chunks"])
    assert max(r["iia_random"]["accuracy"] for r in res["chunks"]) <= 0.2


def test_a_verdict_says_nothing_of_use_from_too_few_scored_pairs():
    """SmolLM2 on coin stories answers a minimal pair's two stories alike (it ignores the turned-over event), so a
    pair (opposite final states) is almost never answered right on both stories: 1 scored pair of 53. A verdict
    must then say that use was not measured, not "not used" from an IIA of one pair (whose interval is
    undefined)."""
    from beliefscope.analyses.interchange_report import MIN_SCORED_PAIRS, _verdict

    def acc(a, lo, hi, n):
        return {"accuracy": a, "interval": [lo, hi], "n_rows": n, "n_groups": n}

    nan = float("nan")
    row = {"probe": acc(0.9, 0.8, 1.0, 50), "majority": acc(0.5, 0.4, 0.6, 50), "bag_of_words": acc(0.6, 0.5, 0.7, 50),
           "iia_probe": acc(0.0, nan, nan, 1), "iia_massmean": acc(0.0, nan, nan, 1),
           "iia_random": acc(0.0, nan, nan, 1), "iia_full": acc(1.0, nan, nan, 1)}
    v = _verdict(row)
    assert v.startswith("readable; use not measured: 1 base story scored") and "over 1 scored" in v
    many = {k: (acc(x["accuracy"], 0.0, 0.1, 40) if k.startswith("iia") else x) for k, x in row.items()}
    many["iia_full"] = acc(0.0, 0.0, 0.05, 40)
    assert _verdict(many).startswith("readable but not used") and MIN_SCORED_PAIRS <= 40
    row["probe"] = acc(0.45, 0.3, 0.6, 50)
    assert _verdict(row).startswith("not readable; use not measured")
