"""The retrieval drafter: n-gram counts against a brute-force reference, atomic save/load, resumable
builds, clear errors, and greedy exactness on the toy target (fixed window and padded variable window)."""

import json
import os
import random
from collections import Counter

import pytest
import torch

from beliefscope.decoding import SpecConfig, generate, speculative_generate
from beliefscope.decoding.datastore import NGramStore, StoreDraftConfig, StoreDrafter
from beliefscope.decoding.store_build import StoreBuildConfig, build_store, greedy_outputs
from beliefscope.decoding.tune import efficient_widths

from .helpers import TARGET

pytestmark = pytest.mark.usefixtures("one_thread")


def brute_counts(seqs, n):
    """{ngram: Counter(next)} by direct enumeration."""
    out = {}
    for s in seqs:
        for i in range(n, len(s)):
            out.setdefault(tuple(s[i - n:i]), Counter())[s[i]] += 1
    return out


def test_counts_match_brute_force():
    rng = random.Random(0)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    store = NGramStore(max_n=3)
    for s in seqs:
        store.add(s)
    assert store.n_tokens == sum(len(s) for s in seqs)
    for n in (1, 2, 3):
        ref = brute_counts(seqs, n)
        assert {k: dict(v) for k, v in ref.items()} == store.tables[n]


def test_incremental_add_equals_one_shot():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    a, b = NGramStore(4), NGramStore(4)
    a.add(seq)
    b.add(seq[:6])
    b.add(seq, start=6)  # only the continuations of positions 6.. are new
    assert a.tables == b.tables


def test_continuation_prefers_longest_suffix():
    store = NGramStore(max_n=3)
    store.add([1, 2, 3, 9, 2, 3, 7, 2, 3, 7])
    assert store.continuation((2, 3)) == (2, 7, 2, 3)  # after (2, 3): 9 once, 7 twice
    assert store.continuation((1, 2, 3)) == (3, 9, 1, 1)  # the 3-gram (1, 2, 3) was followed by 9
    assert store.continuation((8,)) is None


def test_save_load_roundtrip_and_atomic(tmp_path):
    store = NGramStore(max_n=2, meta={"vocab_size": 10})
    store.add([1, 2, 1, 2, 3])
    path = str(tmp_path / "s.json")
    store.save(path)
    back = NGramStore.load(path)
    assert back.tables == store.tables and back.meta == store.meta and back.n_tokens == store.n_tokens
    bad = NGramStore(max_n=1, meta={"oops": object()})  # not JSON-serialisable: the save fails
    with pytest.raises(TypeError):
        bad.save(str(tmp_path / "t.json"))
    assert sorted(os.listdir(tmp_path)) == ["s.json"]  # nothing half-written


def test_load_errors_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="beliefscope datastore"):
        NGramStore.load(str(tmp_path / "missing.json"))
    (tmp_path / "x.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a beliefscope n-gram store"):
        NGramStore.load(str(tmp_path / "x.json"))


def test_drafter_uses_context_and_store():
    store = NGramStore(max_n=3, meta={"vocab_size": 32})
    store.add([10, 11, 12, 13] * 3)
    d = StoreDrafter(store, StoreDraftConfig(min_n=2, min_count=2))
    d.start(None, torch.tensor([20, 21, 22, 20, 21]), None, SpecConfig())
    # context (prompt lookup): (20, 21) was followed by 22 earlier in the request
    assert d.propose(torch.tensor([20, 21, 22, 20, 21]), 2, SpecConfig())[0].tolist() == [22, 20]
    # store: (11, 12) -> 13 -> 10 ...
    assert d.propose(torch.tensor([20, 21, 22, 20, 21, 11, 12]), 3, SpecConfig())[0].tolist() == [13, 10, 11]
    # nothing known: no draft
    assert d.propose(torch.tensor([20, 21, 22, 20, 21, 11, 12, 30]), 3, SpecConfig())[0].numel() == 0


def test_drafter_rejects_other_vocabulary():
    from .helpers import tiny_gpt2_hf

    store = NGramStore(meta={"vocab_size": 49152})
    with pytest.raises(ValueError, match="vocabulary of 49152"):
        StoreDrafter(store).start(tiny_gpt2_hf(), torch.tensor([1, 2]), None, SpecConfig())


def test_efficient_widths():
    assert efficient_widths({1: 1.0, 2: 1.56, 3: 1.93, 4: 1.49, 5: 1.34, 6: 1.40, 7: 1.70, 8: 1.41,
                             9: 1.57}) == (1, 5, 6, 8, 9)
    assert SpecConfig(gamma=8, fixed_window=False, verify_widths=(1, 5, 9)).verify_width(6) == 9
    assert SpecConfig(gamma=8, fixed_window=False).verify_width(3) == 3
    with pytest.raises(ValueError, match="verify_widths"):
        SpecConfig(fixed_window=False, verify_widths=(0, 4))


# --- on the toy target -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy():
    from beliefscope.models.tokenizer import toy_tokenizer

    from .helpers import toy_hf

    return toy_hf("target", TARGET), toy_tokenizer()


def _prompts(tok, split, n, seed):
    from beliefscope.tasks import get_task

    return [tok(e.prompt)["input_ids"] for e in get_task("coinflip", fmt="cot", split=split).examples(n, seed, (1, 8))]


def test_build_resumes_without_duplicating(toy, tmp_path):
    target, tok = toy
    prompts = _prompts(tok, "train", 12, 7)
    cfg = StoreBuildConfig(max_new_tokens=10, batch_size=4, max_n=3)
    out = str(tmp_path / "store.json")
    seen = []

    def interrupt(k):
        seen.append(k)
        if sum(seen) == 8:  # the second batch finishes, then the run is killed
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_store(target, prompts, out, cfg, progress=interrupt)
    assert not os.path.exists(out)
    with open(out + ".partial.jsonl") as f:
        assert len(f.readlines()) == 2
    resumed = []
    store = build_store(target, prompts, out, cfg, progress=resumed.append)
    assert resumed == [8, 4]  # 8 prompts recovered from the partial file, then only the last batch generated
    assert not os.path.exists(out + ".partial.jsonl")
    ref = NGramStore(3)
    for p, o in zip(prompts, greedy_outputs(target, prompts, cfg)):
        ref.add(list(p) + o)
    assert store.tables == ref.tables
    assert store.meta["vocab_size"] == 32


@pytest.mark.slow
def test_greedy_exact_store_drafter_200_heldout(toy):
    """Store built from the target's outputs on train prompts; 200 held-out prompts; every output equals
    the fixed-shape reference (fixed window) and plain greedy (padded variable window)."""
    target, tok = toy
    store = NGramStore(4, meta={"vocab_size": 32})
    train = _prompts(tok, "train", 150, 11)
    for p, o in zip(train, greedy_outputs(target, train, StoreBuildConfig(max_new_tokens=40, batch_size=50))):
        store.add(list(p) + o)
    test = _prompts(tok, "heldout", 200, 4242)
    fixed = SpecConfig(gamma=4, max_new_tokens=20)
    ref = [generate(target, p, fixed, window=fixed.window_size, tokenizer=tok).tokens for p in test]
    plain = [generate(target, p, fixed, tokenizer=tok).tokens for p in test]
    assert plain == ref
    variable = SpecConfig(gamma=6, max_new_tokens=20, fixed_window=False, verify_widths=(1, 5, 7))
    for cfg, want in ((fixed, ref), (variable, plain)):
        outs = [speculative_generate(target, StoreDrafter(store), p, cfg, tokenizer=tok) for p in test]
        bad = [i for i, (o, r) in enumerate(zip(outs, want)) if o.tokens != r]
        assert not bad, f"fixed_window={cfg.fixed_window}: prompts {bad[:5]} differ"
        alpha = sum(o.accepted for o in outs) / max(1, sum(o.drafted for o in outs))
        assert alpha > 0.2  # measured 0.28 (0.44 with min_n=2, min_share=0.6); a random proposal would be
        # ~1/32: the store really predicts the toy's chains (otherwise this test proves little)


@pytest.mark.slow
def test_generate_cli_variable_windows_equal_plain(capsys):
    """`beliefscope generate --verify-widths auto|1,5,8` gives plain greedy's tokens; a bad list is refused."""
    from beliefscope.cli import main

    prompt = "A coin is heads . Alice flips . Bob stays . Carol flips . Think :"
    outs = {}
    for widths in ("fixed", "auto", "1,5,8"):
        drafter = "none" if widths == "fixed" else "ngram:3"
        assert main(["generate", "--model", TARGET, "--drafter", drafter, "--gamma", "6", "--verify-widths", widths,
                     "--max-new-tokens", "16", "--prompt", prompt, "--json"]) == 0
        outs[widths] = json.loads(capsys.readouterr().out)
    assert outs["auto"]["tokens"] == outs["fixed"]["tokens"] == outs["1,5,8"]["tokens"]
    assert outs["1,5,8"]["verify_widths"] == [1, 5, 8]
    assert main(["generate", "--model", TARGET, "--drafter", "ngram:3", "--verify-widths", "0,4",
                 "--prompt", prompt]) == 2
    assert "widths must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_datastore_command_builds_the_stdlib_workload_store(smollm2, tmp_path, monkeypatch, capsys):
    """`beliefscope datastore --workload stdlib` (once `python -m beliefscope.decoding.general_prompts`):
    a store from SmolLM2's greedy answers to the 'store' half of the stdlib requests, labelled as such."""
    import json

    from beliefscope.cli import main
    from beliefscope.models import load as load_mod

    monkeypatch.setattr(load_mod, "load_model", lambda name, **kw: smollm2)  # the session's SmolLM2, no reload
    out = tmp_path / "stdlib.json"
    assert main(["datastore", "--workload", "stdlib", "--n", "2", "--max-new-tokens", "6", "--out", str(out),
                 "--no-progress", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    store = NGramStore.load(str(out))
    assert store.meta["workload"] == "stdlib docstrings, store split" and store.meta["prompts"] == 2
    assert printed["n_tokens"] == store.n_tokens > 12  # the 2 requests and their 6-token answers
