"""TransformerLens-style hook names and their validation.

>>> hook_name("resid_post", 3)
'blocks.3.hook_resid_post'
>>> hook_name("embed")
'hook_embed'
"""

from __future__ import annotations

import difflib

def hf_of(model):
    """The HF model under a TransformerBridge (or the model itself). The one definition: every
    package reads a bridge's model through it (`models.profile` re-exports it)."""
    return getattr(model, "original_model", model)


_HOOK_DICT = "_beliefscope_hook_dict"  # in a bridge's __dict__: (registry size, its hook_dict)


def resolve_hooks(model, names) -> list:
    """The HookPoints for ``names`` (`resolve_hook` for each), reading one hook dictionary.

    TransformerLens 4 rebuilds ``model.hook_dict``, aliases included, on every access (0.3 to 1 ms on a
    30-layer model, paid by every capture and steer), so the last one is kept. It is reused while the
    registry has the same size and every point it gives is still registered under its own name: a component
    swapped in registers new points under the old names, which sends the lookup back to TransformerLens."""
    names = list(names)
    reg = model.__dict__.get("_hook_registry")
    seen = model.__dict__.get(_HOOK_DICT)
    if isinstance(reg, dict) and seen is not None and seen[0] == len(reg):
        points = [seen[1].get(n) for n in names]
        if all(p is not None and reg.get(getattr(p, "name", None)) is p for p in points):
            return points
    hooks = model.hook_dict
    if isinstance(reg, dict):
        model.__dict__[_HOOK_DICT] = (len(reg), hooks)
    return [resolve_hook(model, n, hooks) for n in names]


# short name -> template; "{l}" is the layer
SHORT_NAMES = {
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "resid_mid": "blocks.{l}.hook_resid_mid",
    "resid_post": "blocks.{l}.hook_resid_post",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "k": "blocks.{l}.attn.hook_k",
    "v": "blocks.{l}.attn.hook_v",
    "q": "blocks.{l}.attn.hook_q",
    "z": "blocks.{l}.attn.hook_z",
    "pattern": "blocks.{l}.attn.hook_pattern",
}


def hook_name(kind: str, layer: int | None = None) -> str:
    """Full hook name from a short kind (``resid_post``) and a layer; full names pass through."""
    if kind in ("embed", "hook_embed"):
        return "hook_embed"
    if kind.startswith("blocks.") or kind.startswith("hook_"):
        return kind
    if kind not in SHORT_NAMES:
        close = difflib.get_close_matches(kind, SHORT_NAMES, n=3)
        raise ValueError(f"unknown hook kind {kind!r}; valid kinds: {sorted(SHORT_NAMES)}"
                         + (f" (closest: {close})" if close else ""))
    if layer is None:
        raise ValueError(f"hook kind {kind!r} needs a layer index")
    return SHORT_NAMES[kind].format(l=layer)


def layer_names(model, kind: str = "resid_post", layers="all") -> list[str]:
    """Hook names for `kind` at `layers` ("all", an int, or a list of ints)."""
    n = model.cfg.n_layers
    if layers == "all":
        layers = list(range(n))
    elif isinstance(layers, int):
        layers = [layers]
    bad = [layer for layer in layers if not 0 <= layer < n]
    if bad:
        raise ValueError(f"layers {bad} out of range: this model has layers 0..{n - 1}")
    return [hook_name(kind, layer) for layer in layers]


# Hook names the TransformerLens 4.3 bridge lists for an architecture but never computes (the HF
# module computes that activation inside its own kernel), by HF class: capture refuses them up front.
UNCOMPUTED = {"OPTForCausalLM": ("attn.hook_pattern",)}


def check_computed(model, names) -> None:
    """Raise a ValueError naming the architecture if any of ``names`` is a hook its bridge never fires."""
    arch = type(hf_of(model)).__name__
    bad = [n for n in names if any(n.endswith(suffix) for suffix in UNCOMPUTED.get(arch, ()))]
    if bad:
        raise ValueError(f"{', '.join(bad)}: TransformerLens's bridge for {arch} lists this hook but never computes "
                         f"it (the attention pattern stays inside HF's {arch} attention); capture hook_z or "
                         "hook_attn_out instead, or a model of another architecture")


def resolve_hook(model, name: str, hook_dict: dict | None = None):
    """The HookPoint for `name`; unknown names raise an error listing the closest valid names.

    `hook_dict` is ``model.hook_dict`` if the caller already has it (the bridge rebuilds that
    dict, aliases included, on every access; `resolve_hooks` resolves many names against one)."""
    hooks = model.hook_dict if hook_dict is None else hook_dict
    if name == "hook_embed" and name not in hooks:
        name = "embed.hook_out"
    if name not in hooks and name.endswith(".hook_resid_mid") and name.replace("_mid", "_pre") in hooks:
        arch = type(hf_of(model)).__name__
        raise KeyError(f"{name!r} does not exist in {arch}: its blocks run attention and MLP in parallel on the "
                       "same input, so there is no residual stream between them; use hook_resid_pre, "
                       "hook_attn_out or hook_mlp_out")
    if name not in hooks:
        close = difflib.get_close_matches(name, list(hooks), n=5, cutoff=0.5)
        raise KeyError(f"unknown hook name {name!r}. Closest valid names: {close or sorted(hooks)[:5]}")
    return hooks[name]
