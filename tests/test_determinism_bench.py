"""`beliefscope bench determinism --quick`: the cost table runs end to end on the toy target, its
outputs check is a real comparison, and bad shares or an empty workload are refused."""

import json

import pytest

from beliefscope.benchmarks.common import OUT_ENV


@pytest.mark.slow
def test_quick_bench_writes_the_table(tmp_path, monkeypatch):
    from beliefscope.cli import main

    monkeypatch.setenv(OUT_ENV, str(tmp_path))
    assert main(["bench", "determinism", "--quick", "--json"]) == 0
    res = json.loads((tmp_path / "determinism.json").read_text())
    assert res["quick"] is True and "ratio_at_10pct" in res and res["outputs_identical"] is True
    m = res["models"]["target"]
    assert [r["config"] for r in m["rows"]] == [
        "share 0%", "share 2%", "share 10%", "share 25%", "share 50%", "share 100%", "fixed-shape verify, 50%",
        "fixed-shape verify, 100%", "fixed shape", "batch-invariant fast path, 0%", "batch-invariant fast path, 50%",
        "batch-invariant fast path, 100%"]
    rows = {r["config"]: r for r in m["rows"]}
    assert rows["share 0%"]["deterministic_requests"] == 0 and rows["share 0%"]["verify_forwards"] == 0
    assert rows["share 2%"]["deterministic_requests"] == 1  # at least one when the share is > 0
    assert (rows["share 100%"]["deterministic_requests"]
            == rows["fixed-shape verify, 100%"]["deterministic_requests"] == 8)
    # row-invariant verify computes only the due rows; fixed-shape verify computes every slot of every forward
    assert rows["share 100%"]["verify_rows"] > 0 and rows["share 100%"]["verify_kernels"] == "row-invariant"
    assert rows["batch-invariant fast path, 100%"]["verify_forwards"] == 0  # deterministic by construction
    assert set(m["goals"]) == {"ratio_at_50pct", "ratio_at_100pct"} and m["ratio_at_50pct"] > 0
    assert rows["fixed shape"]["window"] == 1 and rows["fixed shape"]["mean_fast_batch"] == 0  # no fast path
    assert all(r["ratio"]["median"] > 0 and r["tokens_per_s"] > 0 for r in m["rows"])
    assert m["tokens"] == sum(range(4, 9)) or m["tokens"] > 0


def test_deterministic_outputs_equal_across_shares():
    """A request deterministic at 10% and at 100% gives the same tokens in both (the bench's outputs check,
    by hand), and those are the fixed-shape reference tokens."""
    from beliefscope.benchmarks.determinism import QUICK, workload
    from beliefscope.decoding import SpecConfig, generate
    from beliefscope.decoding.scheduler import Scheduler, SchedulerConfig
    from beliefscope.models.testing import tiny_gpt2

    model = tiny_gpt2()
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12, 13]]
    cfg = SchedulerConfig(window=QUICK.window, verify_slots=QUICK.verify_slots, max_batch=QUICK.max_batch,
                          slot_capacity=32)
    outs = {}
    for share in (0.1, 1.0):
        reqs = workload(prompts, QUICK, share)
        res = Scheduler(model, cfg).run(reqs)
        outs[share] = {i: o for i, (o, r) in enumerate(zip(res, reqs)) if r.deterministic}
    assert outs[0.1] and all(outs[1.0][i] == o for i, o in outs[0.1].items())
    reqs = workload(prompts, QUICK, 1.0)
    for i, o in outs[1.0].items():
        ref = SpecConfig(gamma=QUICK.window - 1, max_new_tokens=reqs[i].max_new_tokens, stop_at_eos=False)
        assert o == generate(model, reqs[i].prompt, ref, window=QUICK.window).tokens


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_share_outside_unit_interval_is_refused(share):
    from beliefscope.benchmarks.determinism import QUICK, workload

    with pytest.raises(ValueError, match=f"share {share} is outside \\[0, 1\\]"):
        workload([[1, 2]], QUICK, share)


def test_empty_workload_is_refused():
    from dataclasses import replace

    from beliefscope.benchmarks.determinism import QUICK, workload

    with pytest.raises(ValueError, match="workload is empty"):
        workload([], QUICK, 0.1)
    with pytest.raises(ValueError, match="workload is empty"):
        workload([[1, 2]], replace(QUICK, n_requests=0), 0.1)
