"""The architecture matrix: tiny random decoders of 14 families, built from configs with the shipped
toy tokenizer (each well under 1 MB), and the checks every one of them must pass.

Run as a script to print the matrix as a Markdown table (``python -m tests.architectures``);
tests/test_architectures.py runs the same checks under pytest.
"""

from __future__ import annotations

import copy
import os
import tempfile

import pytest
import torch

TOL = 1e-4  # max |Δ logit| between two computations of the same logits (float32)
WINDOW = 8  # sliding window of the sliding-window families: shorter than every story


PARALLEL = {"GPT-NeoX", "Phi", "Falcon"}  # attention and MLP read the same input: no hook_resid_mid
NO_PATTERN = {"OPT"}  # TransformerLens 4.3's OPT bridge never fires attn.hook_pattern (refused by name)


def _small(**kw) -> dict:
    return {"vocab_size": 32, "max_position_embeddings": 256, **kw}


def configs() -> dict:
    """architecture name -> (config class, model class, config kwargs); dims 32, 2 layers, 4 heads."""
    import transformers as t

    llama = _small(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)
    return {
        "Llama": (t.LlamaConfig, t.LlamaForCausalLM, llama),
        "GPT-2": (t.GPT2Config, t.GPT2LMHeadModel, {"vocab_size": 32, "n_positions": 256, "n_embd": 32,
                                                    "n_layer": 2, "n_head": 4}),
        "GPT-NeoX": (t.GPTNeoXConfig, t.GPTNeoXForCausalLM, _small(hidden_size=32, intermediate_size=64,
                                                                   num_hidden_layers=2, num_attention_heads=4)),
        "Qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, llama),
        "Qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, {**llama, "head_dim": 8}),
        "Gemma": (t.GemmaConfig, t.GemmaForCausalLM, {**llama, "head_dim": 8}),
        "Gemma2 (sliding)": (t.Gemma2Config, t.Gemma2ForCausalLM, {**llama, "head_dim": 8, "sliding_window": WINDOW}),
        "Mistral (sliding)": (t.MistralConfig, t.MistralForCausalLM, {**llama, "sliding_window": WINDOW}),
        "Phi": (t.PhiConfig, t.PhiForCausalLM, _small(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4)),
        "Phi-3 (sliding)": (t.Phi3Config, t.Phi3ForCausalLM, {**llama, "sliding_window": WINDOW,
                                                              "pad_token_id": 0}),
        "OPT": (t.OPTConfig, t.OPTForCausalLM, _small(hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                                      num_attention_heads=4, word_embed_proj_dim=32)),
        "Falcon": (t.FalconConfig, t.FalconForCausalLM, {"vocab_size": 32, "hidden_size": 32,
                                                         "num_hidden_layers": 2, "num_attention_heads": 4,
                                                         "multi_query": True, "new_decoder_architecture": False}),
        "StableLM": (t.StableLmConfig, t.StableLmForCausalLM, llama),
        "OLMo2": (t.Olmo2Config, t.Olmo2ForCausalLM, llama),
    }


def make_hf(arch: str, seed: int = 0):
    """A tiny random HF model of ``arch`` (eval mode, float32)."""
    from beliefscope.models import guard

    cfg_cls, model_cls, kw = configs()[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**kw)).eval()
    guard(model)  # as load_model guards a model: KVCache.for_model needs it
    return model


def tokenizer():
    from beliefscope.models.tokenizer import toy_tokenizer

    return toy_tokenizer()


def story_ids(n_events: int = 12, seed: int = 0) -> list[int]:
    """A toy coin-flip story's token ids (about 40 tokens at 12 events: longer than WINDOW)."""
    from beliefscope.tasks import get_task

    ex = get_task("coinflip", rendering="toy").example(seed=seed, n_events=n_events)
    return tokenizer()(ex.text)["input_ids"]


def recompute_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation with a full uncached forward per token (the reference)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    return ids[len(prompt):]


# ---------------------------------------------------------------------------------------------- checks
# Each check takes (arch, bridge, hf_reference) and raises AssertionError on failure; the reference is a
# separate copy of the same weights that no bridge has touched.

def check_bridge_logits(arch, bridge, ref):
    """Once TransformerLens's bridge is built (it wraps the HF modules in place), the forward runs through its
    wrappers, within TOL of HF's logits."""
    x = torch.tensor([story_ids()])
    assert bridge.bridge is not None  # built
    with torch.no_grad():
        d = (bridge(x, return_type="logits") - ref(x).logits).abs().max().item()
    assert d <= TOL, f"{arch}: bridge logits differ from HF's by {d:.2e}"
    return f"{d:.0e}"


def check_bare(arch, bridge, ref):
    """A Runner runs its HF model's own forward: unhooked, and with every block's resid_pre / resid_post
    captured, no TransformerLens bridge is built, its logits are HF's bit for bit, and the captures are HF's
    hidden states bit for bit (a fresh Runner over a copy of the reference: the matrix's other checks build
    the bridge of theirs)."""
    from beliefscope.hooks import capture, hook_name
    from beliefscope.models.runner import Runner

    x = torch.tensor([story_ids()])
    runner = Runner(copy.deepcopy(ref).eval())
    n = runner.cfg.n_layers

    def same(a, b, what):
        assert torch.equal(a, b), f"{arch}: {what} differ from HF's by {(a - b).abs().max().item():.2e}"

    names = [hook_name(k, layer) for layer in range(n) for k in ("resid_pre", "resid_post")]
    with torch.no_grad():
        want = ref(x, output_hidden_states=True)
        same(runner(x, return_type="logits"), want.logits, "unhooked logits")
        with capture(runner, names) as cap:
            got = runner(x, return_type="logits")
    assert not runner.built, f"{arch}: a resid capture built the TransformerLens bridge"
    same(got, want.logits, "logits under a resid capture")
    h = want.hidden_states  # (embeddings, block 0, ..., block n - 2, final norm of block n - 1)
    for layer in range(n):
        same(cap.stacked(hook_name("resid_pre", layer)), h[layer], f"resid_pre {layer}")
        if layer < n - 1:
            same(cap.stacked(hook_name("resid_post", layer)), h[layer + 1], f"resid_post {layer}")
    return "bit-equal, no bridge built"


def check_capture(arch, bridge, ref):
    from beliefscope.hooks import SHORT_NAMES, capture, hook_name

    x = torch.tensor([story_ids(4)])
    last = bridge.cfg.n_layers - 1
    names = ["hook_embed"] + [hook_name(k, layer) for k in SHORT_NAMES for layer in (0, last)]
    absent = []
    if arch in PARALLEL:  # attention and MLP in parallel: no resid_mid, refused with the reason
        absent = [n for n in names if n.endswith("hook_resid_mid")]
        with pytest.raises(KeyError, match="run attention and MLP in parallel"):
            capture(bridge, absent).__enter__()
    if arch in NO_PATTERN:  # the bridge never computes the pattern: refused by name, before any forward
        absent += [n for n in names if n.endswith("hook_pattern")]
        with pytest.raises(ValueError, match=f"never computes it .*{type(ref).__name__}"):
            capture(bridge, [n for n in names if n.endswith("hook_pattern")]).__enter__()
    names = [n for n in names if n not in absent]
    with torch.no_grad(), capture(bridge, names) as cap:
        bridge(x, return_type="logits")
    for n in names:
        got = cap.stacked(n)
        assert got.shape[:2] == (1, x.shape[1]) or (n.endswith("hook_pattern") and got.shape[0] == 1), \
            f"{arch}: {n} captured shape {tuple(got.shape)}"
    with torch.no_grad():
        h = ref(x, output_hidden_states=True).hidden_states  # (embed, block 0, ..., final norm applied last)
    d = (cap.stacked(hook_name("resid_post", 0)) - h[1]).abs().max().item()
    assert d <= TOL, f"{arch}: blocks.0.hook_resid_post differs from HF's hidden state by {d:.2e}"
    return f"{len(names)} hooks" + (f"; {len(absent)} refused" if absent else "")


def check_hf_generate(arch, bridge, ref):
    from beliefscope.models.testing import compare_generate

    x = torch.tensor([story_ids(6)])
    for mode in ({"do_sample": False}, {"do_sample": False, "prompt_lookup_num_tokens": 3}):
        theirs, ours = compare_generate(bridge.original_model, x, max_new_tokens=12, capacity=96, **mode)
        assert torch.equal(theirs, ours), f"{arch}: HF generate {mode} with KVCache differs from HF's own cache"
    return "greedy, lookup"


def check_fork(arch, bridge, ref):
    from beliefscope.cache import KVCache

    ids = story_ids(12)
    n, at = len(ids), len(ids) - 12
    replay = torch.tensor([[(t * 7 + 3) % 30 + 1 for t in ids[at:]]])  # 12 other tokens
    with torch.no_grad():
        cache = KVCache.for_model(bridge, capacity=n + 16)
        bridge(torch.tensor([ids]), past_key_values=cache, return_type="logits")
        with cache.fork(at=at) as branch:
            got = bridge(replay, return_type="logits", **branch.forward_kwargs(replay.shape[1]))
        full = ref(torch.cat([torch.tensor([ids[:at]]), replay], 1)).logits[:, at:]
    d = (got - full).abs().max().item()
    assert d <= TOL, f"{arch}: fork(at={at}) + replay differs from the recompute by {d:.2e}"
    return f"{d:.0e}"


def check_decoding(arch, bridge, ref):
    from beliefscope.decoding import NGramDrafter, SpecConfig, TreeConfig, generate, speculative_generate

    prompt = story_ids(6)
    want = recompute_greedy(ref, prompt, 16)
    plain = SpecConfig(max_new_tokens=16, stop_at_eos=False)
    tree = SpecConfig(max_new_tokens=16, stop_at_eos=False, tree=TreeConfig(nodes=6, depth=3, min_share=0.0))
    runs = {"plain": generate(bridge, prompt, plain).tokens,
            "ngram": speculative_generate(bridge, NGramDrafter(2), prompt, plain).tokens,
            "tree": speculative_generate(bridge, NGramDrafter(2), prompt, tree).tokens}
    for name, got in runs.items():
        assert got == want, f"{arch}: {name} decoding {got} != recompute greedy {want}"
    return "plain, ngram, tree"


def check_harvest_forced(arch, bridge, ref):
    from beliefscope.analyses.forced import forced_answers
    from beliefscope.probes.harvest import harvest
    from beliefscope.tasks import get_task

    tok = tokenizer()
    exs = get_task("coinflip", rendering="toy").examples(3, seed=1, events="4-6")
    with tempfile.TemporaryDirectory() as out:
        store = harvest(bridge, tok, exs, "resid_post", "all", os.path.join(out, "s"), config={"arch": arch},
                        batch_size=2)
        acts = store.load_hook(f"blocks.{bridge.cfg.n_layers - 1}.hook_resid_post")
        assert acts.shape[0] == sum(len(e.labels(tok).input_ids) for e in exs)
    a = forced_answers(bridge, tok, exs[0], use_fork=True)
    b = forced_answers(bridge, tok, exs[0], use_fork=False)
    d = float(abs(a.p_state - b.p_state).max())
    assert d <= 1e-4, f"{arch}: forced answers through the fork differ from recomputation by {d:.2e}"
    return f"{acts.shape[0]} rows"


CHECKS = {
    "bridge logits": check_bridge_logits,
    "capture": check_capture,
    "bare HF": check_bare,
    "HF generate": check_hf_generate,
    "fork": check_fork,
    "decoding": check_decoding,
    "harvest + forced": check_harvest_forced,
}


def built(arch: str):
    """(Runner, untouched HF reference) of ``arch``."""
    from beliefscope.models.runner import Runner

    hf = make_hf(arch)
    ref = copy.deepcopy(hf)
    return Runner(hf, tokenizer()), ref


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for arch in configs():
        bridge, ref = built(arch)
        cells = []
        for name, check in CHECKS.items():
            try:
                cells.append(f"pass ({check(arch, bridge, ref)})")
            except Exception as e:  # noqa: BLE001 (a table of outcomes)
                cells.append(f"**{type(e).__name__}**: {str(e)[:90]}")
        rows.append(f"| {arch} | " + " | ".join(cells) + " |")
    print("| architecture | " + " | ".join(CHECKS) + " |")
    print("|" + "---|" * (len(CHECKS) + 1))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
