"""Speculative prefill for Thinking States: drafting several chunks in one forward, keeping those up to
the first non-empty thought, gives the thoughts, logits and answer of chunk-by-chunk inference."""

import pytest
import torch

from beliefscope.cache import Provenance
from beliefscope.decoding.thinking import run_thinking
from beliefscope.models.train_rope import RopeTrainConfig, build
from beliefscope.tasks import get_task


@pytest.fixture(scope="module")
def mixed_thinking():
    """A random Thinking States model whose S changes the forward, where about two thoughts in three
    count as empty (S carries over): drafts get kept in part and rolled back in part."""
    torch.manual_seed(1)
    model, tok = build(RopeTrainConfig(preset="thinking", d_model=32, n_layers=3, n_heads=4, empty_thoughts=True))
    torch.nn.init.normal_(model.out_proj.weight, std=0.2)
    model.carries = lambda z: z[0] % 3 != 0
    return model.eval(), tok


@pytest.mark.parametrize("n_events", [1, 5, 12])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_speculative_prefill_equals_chunk_by_chunk(mixed_thinking, n_events, k):
    model, tok = mixed_thinking
    ids = tok(get_task("coinflip").example(seed=n_events, n_events=n_events).prompt)["input_ids"]
    ref = run_thinking(model, ids, max_new_tokens=3, stop_at_eos=False)
    spec = run_thinking(model, ids, max_new_tokens=3, stop_at_eos=False, prefill="speculative", k=k)
    assert spec.thoughts == ref.thoughts and spec.tokens == ref.tokens
    assert (spec.logits - ref.logits).abs().max() <= 1e-4
    assert spec.cache.seq_len == ref.cache.seq_len
    drafted = sum(e - a for a, e, _ in spec.spec_steps)
    kept = sum(kept - a for a, _, kept in spec.spec_steps)
    rolled = [e for e in spec.cache.recorder.events if e.kind == "rollback"]
    assert len(rolled) == sum(kept_end < e for _, e, kept_end in spec.spec_steps)  # one rollback per partial keep
    assert drafted - kept == sum(len(r.ids) if hasattr(r, "ids") else r.provenance.numel()
                                 for r in spec.cache.recorder.rejected)
    assert not (spec.cache.recorder.provenance_of(0) == Provenance.DRAFT).any()  # every kept draft was verified


def test_drafts_are_kept_several_chunks_at_a_time(mixed_thinking):
    model, tok = mixed_thinking
    ids = tok(get_task("coinflip").example(seed=3, n_events=16).prompt)["input_ids"]
    spec = run_thinking(model, ids, max_new_tokens=1, prefill="speculative", k=8)
    chunks = len(spec.thoughts)
    assert chunks / len(spec.spec_steps) > 1.5  # more than one chunk per backbone forward


def test_shipped_thinking_is_unchanged_by_speculative_prefill():
    from beliefscope.models import load_model

    model, tok = load_model("thinking")
    for ex in get_task("coinflip").examples(4, seed=4, events="3-8"):
        ids = tok(ex.prompt)["input_ids"]
        a = run_thinking(model, ids, max_new_tokens=1)
        b = run_thinking(model, ids, max_new_tokens=1, prefill="speculative", k=4)
        assert (a.thoughts, a.tokens) == (b.thoughts, b.tokens)


@pytest.mark.parametrize("kw, match", [({"k": 0}, "k >= 1"), ({"intervene": lambda j, s: s}, "intervene"),
                                       ({"prefill": "eager"}, "prefill='eager' is unknown")])
def test_bad_prefill_arguments_fail_before_any_forward(mixed_thinking, monkeypatch, kw, match):
    model, tok = mixed_thinking
    # every backbone forward, chunked or speculative, goes through this method
    monkeypatch.setattr(model, "backbone_forward", lambda *a, **k: pytest.fail("a forward ran"))
    kw = {"prefill": "speculative", **kw}
    with pytest.raises(ValueError, match=match):
        run_thinking(model, tok("A coin is heads . Alice flips . State ?")["input_ids"], **kw)


def test_thinking_empty_drafts_and_matches_chunk_by_chunk():
    """The shipped model trained with empty thoughts: the same thoughts and answers either way, and
    more than one chunk kept per drafting forward (a stay needs no new state)."""
    from beliefscope.models import load_model

    model, tok = load_model("thinking-empty")
    chunks = forwards = 0
    for ex in get_task("coinflip").examples(6, seed=11, events="6-12"):
        ids = tok(ex.prompt)["input_ids"]
        a = run_thinking(model, ids, max_new_tokens=1)
        b = run_thinking(model, ids, max_new_tokens=1, prefill="speculative", k=8)
        assert (a.thoughts, a.tokens) == (b.thoughts, b.tokens)
        assert tok.decode(b.tokens[:1]) == ex.answer
        assert any(z == [model.eos_id] for _, z in a.thoughts)  # the stays left their thought empty
        chunks, forwards = chunks + len(b.thoughts), forwards + len(b.spec_steps)
    assert chunks / forwards > 1.3


def test_speculative_prefill_figure_shows_every_draft(mixed_thinking):
    from beliefscope.analyses.thinking_view import speculative_prefill_figure

    model, tok = mixed_thinking
    run = run_thinking(model, tok(get_task("coinflip").example(seed=2, n_events=9).prompt)["input_ids"],
                       max_new_tokens=1, prefill="speculative", k=4)
    assert len(run.spec_thoughts) == len(run.spec_steps) >= 2
    kept = [(e, z) for d, (_, _, k) in zip(run.spec_thoughts, run.spec_steps, strict=True) for e, z in d if e <= k]
    assert kept == run.thoughts[: len(kept)]  # the kept drafts are the run's thoughts, in order
    fig = speculative_prefill_figure(run, tok)
    assert len(fig.axes[0].patches) >= sum(e for _, e, _ in run.spec_steps)  # a cell per position per row


@pytest.mark.parametrize("name", ["thinking", "thinking-empty"])
def test_thought_lookup_gives_plain_greedy_thoughts_in_fewer_forwards(name, monkeypatch):
    """`ThinkingStates.think` feeds remembered thoughts in its first forward: the thoughts are those
    of plain greedy decoding (lookup=0), for every chunk of 16 toy stories, with fewer T forwards."""
    from beliefscope.models import load_model

    model, tok = load_model(name)
    stories = [tok(e.prompt)["input_ids"] for e in get_task("coinflip").examples(16, 515, (1, 16))]
    calls = {"n": 0}
    forward = type(model).think_logits

    def counted(self, *a, **kw):
        calls["n"] += 1
        return forward(self, *a, **kw)

    monkeypatch.setattr(type(model), "think_logits", counted)
    runs, forwards = {}, {}
    for lookup in (0, 4):
        model.thinking_config.lookup, calls["n"] = lookup, 0
        runs[lookup] = [run_thinking(model, ids, max_new_tokens=1, prefill="speculative", k=4) for ids in stories]
        forwards[lookup] = calls["n"]
    model.thinking_config.lookup = 4
    assert [(r.thoughts, r.tokens) for r in runs[4]] == [(r.thoughts, r.tokens) for r in runs[0]]
    assert forwards[4] < 0.8 * forwards[0], forwards


def test_generate_json_marks_empty_thoughts(capsys):
    """`beliefscope generate` on a model trained with empty thoughts: each thought says whether it is
    empty (S carried over), and the empty ones are exactly the events that change nothing."""
    import json

    from beliefscope.cli import main

    story = "A coin is heads . Alice flips . Bob stays . Carol stays . Dan flips . State ?"
    assert main(["generate", "--model", "thinking-empty", "--json", "--quiet", "--prompt", story]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["empty"] for t in out["thoughts"]] == [False, False, True, True, False]  # intro, flip, stay, stay, flip
    assert [t["thought"].split()[0] for t in out["thoughts"] if not t["empty"]] == ["heads", "tails", "heads"]
    assert out["text"].strip() == "heads"


@pytest.mark.slow
def test_thought_drafter_keeps_more_chunks_and_changes_no_output():
    """Speculative prefill with drafted thoughts (models.thinking.drafter) on the shipped model with
    empty thoughts: on 60 toy stories of 1-24 events, the thoughts and answer of every story are
    those of chunk-by-chunk inference, and a drafter shared across stories keeps more chunks per
    backbone forward than drafting every thought empty (the paper's assumption)."""
    from beliefscope.models import load_model
    from beliefscope.models.thinking.drafter import thought_drafter_factory

    model, tok = load_model("thinking-empty")
    stories = [tok(e.prompt)["input_ids"] for e in get_task("coinflip").examples(60, 2026, (1, 24))]
    kept = {}
    for kind in ("shared", "empty"):
        drafter, chunks, forwards = thought_drafter_factory(kind, model.eos_id), 0, 0
        for ids in stories if kind == "shared" else stories[:20]:
            ref = run_thinking(model, ids, max_new_tokens=1)
            spec = run_thinking(model, ids, max_new_tokens=1, prefill="speculative", k=8, thought_drafter=drafter())
            assert (spec.thoughts, spec.tokens) == (ref.thoughts, ref.tokens)
            chunks, forwards = chunks + len(spec.thoughts), forwards + len(spec.spec_steps)
        kept[kind] = chunks / forwards
    assert kept["shared"] > 1.5 * kept["empty"], kept


def test_a_wrong_thought_drafter_costs_forwards_not_correctness(mixed_thinking):
    """A drafter that always drafts a thought T never writes: every draft is cut after its first chunk,
    and the run is still chunk-by-chunk inference, logit for logit."""
    from beliefscope.models.thinking.drafter import ThoughtDrafter

    class Wrong(ThoughtDrafter):
        def predict(self, state, chunk):
            return [7, 7]

    model, tok = mixed_thinking
    ids = tok(get_task("coinflip").example(seed=8, n_events=10).prompt)["input_ids"]
    ref = run_thinking(model, ids, max_new_tokens=2, stop_at_eos=False)
    spec = run_thinking(model, ids, max_new_tokens=2, stop_at_eos=False, prefill="speculative", k=4,
                        thought_drafter=Wrong(model.eos_id))
    assert (spec.thoughts, spec.tokens) == (ref.thoughts, ref.tokens)
    assert (spec.logits - ref.logits).abs().max() <= 1e-4
    assert len(spec.spec_steps) == len(spec.thoughts)  # one chunk kept per drafting forward
    assert all(d == [[7, 7]] * len(d) for d in spec.spec_drafts)


def test_generate_with_speculative_prefill_prints_the_chunked_thoughts(capsys):
    """`beliefscope generate --prefill speculative`: the thoughts (with the chunk each follows) and the
    answer of `--prefill chunked`, in fewer backbone forwards."""
    import json

    from beliefscope.cli import main
    from beliefscope.tasks.coinflip import TOY_NAMES

    events = [f"{TOY_NAMES[i % len(TOY_NAMES)]} {'flips' if i % 3 else 'stays'} ." for i in range(12)]
    story = " ".join(["A coin is heads .", *events, "State ?"])
    outs = {}
    for prefill in ("chunked", "speculative"):
        assert main(["generate", "--model", "thinking-empty", "--json", "--quiet", "--prefill", prefill,
                     "--k", "8", "--prompt", story]) == 0
        outs[prefill] = json.loads(capsys.readouterr().out)
    a, b = outs["chunked"], outs["speculative"]
    assert (a["thoughts"], a["text"]) == (b["thoughts"], b["text"])
    assert all(t["after"].strip().endswith(".") for t in b["thoughts"])
    assert b["backbone_forwards_prefill"] < a["backbone_forwards_prefill"]
