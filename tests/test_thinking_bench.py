"""`bench thinking`: the CoT baseline with its best drafter decodes what plain greedy decodes, and
the quick run reports every path, with speculative prefill equal to chunk by chunk."""

from dataclasses import replace

import pytest


def test_cot_with_drafter_matches_plain_greedy():
    from beliefscope.benchmarks.thinking import _cot_answer, _cot_drafted
    from beliefscope.decoding.drafters import make_drafter
    from beliefscope.models import load_model
    from beliefscope.tasks import get_task

    cot, tok = load_model("cot-rope")
    for ex in get_task("coinflip", fmt="cot").examples(6, 31, "3-8"):
        n = len(tok(ex.completion)["input_ids"]) + 2
        plain = _cot_answer(cot, tok, ex.prompt, n)
        for spec in ("ngram:2", "early-exit:2"):
            assert _cot_drafted(cot, tok, ex.prompt, n, make_drafter(spec, cot)) == plain, (spec, ex.prompt)


@pytest.mark.slow
def test_quick_bench_reports_the_drafted_baseline(tmp_path, monkeypatch):
    from beliefscope.benchmarks import common
    from beliefscope.benchmarks import thinking as bench_thinking
    from beliefscope.benchmarks.thinking import QUICK, main
    from beliefscope.decoding import tune

    monkeypatch.setattr(common, "result_path", lambda name, quick: str(tmp_path / f"{name}.json"))
    picked = tune.choose_drafter
    # whichever is faster on this machine, the drafted path must then be timed: pretend ngram:3 won
    monkeypatch.setattr(bench_thinking, "choose_drafter", lambda *a, **kw: ("ngram:3", picked(*a, **kw)[1]))
    r = main(quick=True, config=replace(QUICK, cot_drafters=("ngram:3",)))
    band = r["bands"]["3-4"]
    assert band["speculative_equals_chunked"] == 1.0
    assert band["cot_drafter"] == "ngram:3" and set(band["cot_drafter_seconds"]) == {"none", "ngram:3"}
    assert band["speedup_vs_cot_drafted_speculative"]["n"] == QUICK.n_prompts
    best = max(band[f"speedup_vs_cot_drafted_{p}"]["median"] for p in ("chunked", "speculative"))
    assert r["speedup_vs_cot_drafted_3_4"] == pytest.approx(best)
    assert (tmp_path / "thinking.json").exists()
