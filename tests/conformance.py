"""The cache conformance suite: every check runs once with HF's ``DynamicCache`` (the control) and
once with ``KVCache``, on tiny random GPT-2, Llama, Mistral (window 8) and Gemma2 (window 8) models,
and the two results must agree. A check may instead end in a documented refusal of ``KVCache``
(`REFUSALS`); a check that fails for both caches documents transformers' own behaviour.

``python -m tests.conformance`` prints the table (check x cache, with totals).
"""

from __future__ import annotations

import copy
import gc
import pickle

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

MODELS = ("GPT-2", "Llama", "Mistral (sliding)", "Gemma2 (sliding)")
TOL = 1e-4


def hf_model(arch: str, seed: int = 0):
    from .architectures import make_hf

    return make_hf(arch, seed)


def dynamic(model, batch: int):
    return DynamicCache(config=model.config)


def kvcache(model, batch: int, capacity: int = 8):
    from beliefscope.cache import KVCache

    return KVCache.for_model(model, batch=batch, capacity=capacity)  # small: most checks grow past it


CACHES = {"DynamicCache": dynamic, "KVCache": kvcache}


def ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 32, (batch, n), generator=torch.Generator().manual_seed(seed))  # [batch, n]


def fwd(model, x, cache, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(x, past_key_values=cache, use_cache=True, **kw).logits  # [batch, n, vocab]


def last_keys(cache, layer: int, k: int = 4) -> torch.Tensor:
    return cache.layers[layer].keys[..., -k:, :].clone()  # [batch, kv_heads, k, d_head]


# ------------------------------------------------------------------------------------------------ API checks
def seq_length(model, make):
    c = make(model, 1)
    fwd(model, ids(7), c)
    return c.get_seq_length(), [layer.get_seq_length() for layer in c.layers]


def layer_keys_values(model, make):
    c = make(model, 1)
    fwd(model, ids(10), c)
    return [last_keys(c, i) for i in (0, -1)] + [c.layers[-1].values[..., -4:, :].clone()]


def decode(model, make):
    c = make(model, 1)
    out = [fwd(model, ids(10), c)[:, -1]]
    out += [fwd(model, t[None, None], c)[:, -1] for t in ids(3, seed=1)[0]]
    return torch.stack(out)


def crop_negative(model, make):
    c = make(model, 1)
    fwd(model, ids(10), c)
    c.crop(-2)
    return c.get_seq_length(), fwd(model, ids(1, seed=2), c)


def crop_zero(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    c.crop(0)
    return c.get_seq_length(), fwd(model, ids(1, seed=2), c)


def crop_positive(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    c.crop(3)
    return c.get_seq_length()


def reset(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    c.reset()
    return c.get_seq_length(), fwd(model, ids(4, seed=3), c)


def reorder_cache(model, make):
    c = make(model, 2)
    fwd(model, ids(6, batch=2), c)
    c.reorder_cache(torch.tensor([1, 0]))
    return fwd(model, ids(1, batch=2, seed=4), c)


def batch_repeat_interleave(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    c.batch_repeat_interleave(2)
    return fwd(model, ids(1, batch=2, seed=4), c)


def batch_select_indices(model, make):
    c = make(model, 2)
    fwd(model, ids(6, batch=2), c)
    c.batch_select_indices(torch.tensor([1]))
    return fwd(model, ids(1, seed=4), c)


def mask_sizes_full_layer(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    types = getattr(model.config, "layer_types", None) or []
    windowed = getattr(model.config, "sliding_window", None) and not types
    full = [i for i in range(len(c.layers)) if not windowed and (not types or types[i] == "full_attention")]
    return [c.layers[i].get_mask_sizes(1) for i in full]


def flags(model, make):
    c = make(model, 1)
    fwd(model, ids(3), c)
    return c.is_compileable, c.is_initialized if hasattr(c, "is_initialized") else None


def layer_crop_alone(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    c.layers[0].crop(-1)
    return [layer.get_seq_length() for layer in c.layers]


def layer_reorder_alone(model, make):
    c = make(model, 2)
    fwd(model, ids(6, batch=2), c)
    c.layers[0].reorder_cache(torch.tensor([1, 0]))
    return last_keys(c, 0)


def base_crop_loop(model, make):
    """transformers' base ``Cache.crop`` (what a subclass without its own crop runs) on every layer."""
    c = make(model, 1)
    fwd(model, ids(5), c)
    Cache.crop(c, -1)
    return [layer.get_seq_length() for layer in c.layers]


def deepcopy_independent(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    d = copy.deepcopy(c)
    out = fwd(model, ids(2, seed=5), d)
    return c.get_seq_length(), d.get_seq_length(), last_keys(c, 0), out, fwd(model, ids(2, seed=5), c)


def deepcopy_outlives_original(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    d = copy.deepcopy(c)
    del c
    gc.collect()
    return d.get_seq_length(), fwd(model, ids(2, seed=5), d), d.layers[0].get_seq_length()


def pickle_round_trip(model, make):
    c = make(model, 1)
    fwd(model, ids(6), c)
    d = pickle.loads(pickle.dumps(c))
    return d.get_seq_length(), fwd(model, ids(2, seed=5), d)


# ------------------------------------------------------------------------------------------- generate checks
def _generate(model, make, x, rows, seed=0, **kw):
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(x, past_key_values=make(model, rows), max_new_tokens=8, pad_token_id=0, **kw)


def gen_greedy(model, make):
    return _generate(model, make, ids(6), 1, do_sample=False)


def gen_sampling(model, make):
    return _generate(model, make, ids(6), 1, do_sample=True, temperature=1.5, top_k=0)


def gen_beam_search(model, make):
    return _generate(model, make, ids(6), 3, do_sample=False, num_beams=3)


def gen_beam_sampling(model, make):
    return _generate(model, make, ids(6), 3, do_sample=True, num_beams=3, temperature=1.5, top_k=0)


def gen_prompt_lookup(model, make):
    x = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 3, 4]])
    return _generate(model, make, x, 1, do_sample=False, prompt_lookup_num_tokens=3)


def gen_assisted(model, make):
    draft = hf_model(_arch_of(model), seed=1)
    return _generate(model, make, ids(6), 1, do_sample=False, assistant_model=draft)


def gen_left_padding(model, make):
    x = torch.cat([torch.tensor([[0, 0]]), ids(4)], 1)
    x = torch.cat([x, ids(6, seed=9)])  # [2, 6]: row 0 left-padded by 2
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    return _generate(model, make, x, 2, do_sample=False, attention_mask=mask)


def gen_inputs_embeds(model, make):
    emb = model.get_input_embeddings()(ids(6))  # [1, 6, d_model]
    torch.manual_seed(0)
    with torch.no_grad():
        return model.generate(inputs_embeds=emb, past_key_values=make(model, 1), max_new_tokens=8, do_sample=False,
                              pad_token_id=0)


def gen_continuation(model, make):
    torch.manual_seed(0)
    with torch.no_grad():
        first = model.generate(ids(6), past_key_values=make(model, 1), max_new_tokens=5, do_sample=False,
                               pad_token_id=0, return_dict_in_generate=True)
        more = torch.cat([first.sequences, ids(2, seed=7)], 1)
        return model.generate(more, past_key_values=first.past_key_values, max_new_tokens=5, do_sample=False,
                              pad_token_id=0)


def gen_deepcopy_per_request(model, make):
    """Prefill a shared prompt once, then deep-copy the cache for each request."""
    prompt = ids(6)
    shared = make(model, 1)
    fwd(model, prompt, shared)
    outs = []
    for seed in (11, 12):
        req = torch.cat([prompt, ids(3, seed=seed)], 1)
        torch.manual_seed(0)
        with torch.no_grad():
            outs.append(model.generate(req, past_key_values=copy.deepcopy(shared), max_new_tokens=6,
                                       do_sample=False, pad_token_id=0))
    return outs + [shared.get_seq_length()]


def gen_growth_past_capacity(model, make):
    return _generate(model, make, ids(20), 1, do_sample=False)  # KVCache capacity 8: grows twice


def _arch_of(model) -> str:
    return {"GPT2LMHeadModel": "GPT-2", "LlamaForCausalLM": "Llama", "MistralForCausalLM": "Mistral (sliding)",
            "Gemma2ForCausalLM": "Gemma2 (sliding)"}[type(model).__name__]


CHECKS = {f.__name__: f for f in (
    seq_length, layer_keys_values, decode, crop_negative, crop_zero, crop_positive, reset, reorder_cache,
    batch_repeat_interleave, batch_select_indices, mask_sizes_full_layer, flags, layer_crop_alone,
    layer_reorder_alone, base_crop_loop, deepcopy_independent, deepcopy_outlives_original, pickle_round_trip,
    gen_greedy, gen_sampling, gen_beam_search, gen_beam_sampling, gen_prompt_lookup, gen_assisted,
    gen_left_padding, gen_inputs_embeds, gen_continuation, gen_deepcopy_per_request, gen_growth_past_capacity)}

def crop_negative_reference(model):
    """What ``crop_negative`` must give: the length, and the logits of an uncached forward."""
    x = torch.cat([ids(10)[:, :8], ids(1, seed=2)], 1)
    with torch.no_grad():
        return 8, model(x, use_cache=False).logits[:, -1:]


# check -> the cache-free reference of its result, where the control itself may fail (DynamicCache's
# sliding layers cannot crop once past the window unless past recording was switched on).
REFERENCES = {"crop_negative": crop_negative_reference}

# check -> what KVCache's refusal must say: operations on one layer alone (its layers share one length
# per row and one row order), documented in the README's cache section.
REFUSALS = {"layer_crop_alone": "on KVCache layer 0 alone is refused",
            "layer_reorder_alone": "on KVCache layer 0 alone is refused",
            "base_crop_loop": "on KVCache layer 0 alone is refused"}


def run(check: str, model, cache: str):
    """``("ok", result)`` or ``("error", "Type: message")``."""
    try:
        return "ok", CHECKS[check](model, CACHES[cache])
    except Exception as e:  # noqa: BLE001 (outcomes are compared)
        return "error", f"{type(e).__name__}: {e}"


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and (a.dtype == torch.long and torch.equal(a, b)
                                       or a.dtype != torch.long and bool((a - b).abs().max() <= TOL))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def verdict(check: str, model) -> tuple[str, str, str]:
    """(outcome with DynamicCache, outcome with KVCache, verdict): agree / refused (documented) /
    both fail (transformers' own behaviour) / KVCache only (= recompute, where the control fails) / DIFFER."""
    (sd, d), (sk, k) = run(check, model, "DynamicCache"), run(check, model, "KVCache")
    if sd == "error" and sk == "error":
        return d, k, "both fail"
    if sk == "error" and check in REFUSALS and REFUSALS[check] in k:
        return "ok", k, "refused (documented)"
    if sd == sk == "ok" and same(d, k):
        return "ok", "ok", "agree"
    if sd == "error" and sk == "ok" and check in REFERENCES and same(k, REFERENCES[check](model)):
        return d, "ok", "KVCache only (= recompute)"
    return (d if sd == "error" else "ok"), (k if sk == "error" else "ok"), "DIFFER"


def main() -> None:
    torch.set_num_threads(1)
    totals = {}
    print("| check | " + " | ".join(MODELS) + " |")
    print("|" + "---|" * (len(MODELS) + 1))
    models = {a: hf_model(a) for a in MODELS}
    for check in CHECKS:
        cells = []
        for a in MODELS:
            d, k, v = verdict(check, models[a])
            totals[v] = totals.get(v, 0) + 1
            cells.append(v if v in ("agree",) else f"{v}: Dynamic {d[:60]} / KVCache {k[:60]}")
        print(f"| {check} | " + " | ".join(cells) + " |")
    print("\ntotals: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))


if __name__ == "__main__":
    main()
