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


def resolve_hooks(model, names) -> list:
    """The HookPoints for ``names`` (`resolve_hook` for each).

    TransformerLens 4 rebuilds ``model.hook_dict``, aliases included, on every access (0.3 to 1 ms on a
    30-layer model, paid by every capture and steer), so each name is first asked of the bridge's public
    ``get_hook_point`` (a registry lookup, or an attribute walk for an alias: the same HookPoint as
    ``hook_dict[name]`` on every family tests/architectures.py builds). The names `resolve_hook` treats
    specially (``hook_embed``, ``hook_resid_mid``), and any the bridge does not find, go through `resolve_hook`
    and its error with the closest valid names."""
    names = list(names)
    plain = getattr(model, "plain_hook_point", None)  # a Runner: block inputs/outputs with no bridge built
    if plain is not None:
        points = [plain(n) for n in names]
        if all(p is not None for p in points):
            return points
    ask = getattr(model, "get_hook_point", None)
    if ask is not None and not any(n == "hook_embed" or n.endswith(".hook_resid_mid") for n in names):
        points = [ask(n) for n in names]
        if all(p is not None for p in points):
            return points
    hooks = model.hook_dict
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


EMBED_NAMES = ("embed", "hook_embed")  # the embedding hook's spellings (it has no layer)


def _layer_item(text: str, n_layers: int, spec: str) -> list[int]:
    """Layers of one ``@`` item: ``all``, ``N`` (negatives count from the end), or an inclusive ``A-B``."""
    text = text.strip()
    if text in ("all", "*"):
        return list(range(n_layers))
    try:
        if text.lstrip("-").isdigit():
            layer = int(text)
            got = [layer + n_layers if layer < 0 else layer]
        else:
            a, b = (int(x) for x in text.split("-"))
            if b < a:
                raise ValueError
            got = list(range(a, b + 1))
    except ValueError:
        raise ValueError(f"hook spec {spec!r}: layer {text!r} is not N, -N, A-B or all "
                         "(e.g. resid_post@3, resid_post@-1, resid_post@0-5, resid_post@0,3,5)") from None
    bad = [x for x in got if not 0 <= x < n_layers]
    if bad:
        raise ValueError(f"hook spec {spec!r}: layer {text} is out of range; this model has layers 0..{n_layers - 1} "
                         "(negatives count from the end: -1 is the last)")
    return got


def parse_hooks(spec, n_layers: int, layers="all") -> list[str]:
    """Full hook names for a hook spec: **the one grammar** of `capture`, `steer`, `harvest` and the CLI's
    ``--hooks``.

    ``spec`` is a string of comma-separated items, or a list of them. An item is

    - a full TransformerLens name (``blocks.3.hook_resid_post``, ``blocks.0.attn.hook_k``, ``hook_embed``,
      ``ln_final.hook_scale``: any name with a dot), kept as it is (checked against the model when resolved);
    - ``embed``: the embedding hook;
    - a short kind (``resid_post``, ``attn_out``, ``k``... see `SHORT_NAMES`) at ``layers``;
    - ``KIND@LAYERS``: the kind at the layers named, ``N`` (negatives count from the end, ``-1`` the last),
      an inclusive range ``A-B`` or ``all``; bare numbers after it continue its list
      (``resid_post@0,3,5``).

    ``layers`` (for kinds without ``@``): ``"all"``, an int, a list of ints or a comma-separated string.
    Order is kept and duplicates dropped.

    >>> parse_hooks("resid_post@-1,attn_out@0-1", n_layers=4)
    ['blocks.3.hook_resid_post', 'blocks.0.hook_attn_out', 'blocks.1.hook_attn_out']
    >>> parse_hooks("embed,resid_post@0,2", n_layers=4)
    ['hook_embed', 'blocks.0.hook_resid_post', 'blocks.2.hook_resid_post']
    >>> parse_hooks(["resid_post", "blocks.1.attn.hook_k"], n_layers=2, layers=[1])
    ['blocks.1.hook_resid_post', 'blocks.1.attn.hook_k']
    """
    items = [x.strip() for x in spec.split(",")] if isinstance(spec, str) else [str(x).strip() for x in spec]
    if isinstance(layers, str) and layers not in ("all", "*"):
        layers = [int(x) for x in layers.split(",") if x.strip()]
    default = _layer_item("all", n_layers, str(spec)) if layers in ("all", "*") else \
        [_layer_item(str(x), n_layers, str(spec))[0] for x in ([layers] if isinstance(layers, int) else layers)]
    names, last_kind = [], None
    for item in items:
        if not item:
            raise ValueError(f"hook spec {spec!r} has an empty item: separate items with single commas")
        if last_kind is not None and (item.lstrip("-").isdigit() or item[0].isdigit()):
            names += [hook_name(last_kind, x) for x in _layer_item(item, n_layers, str(spec))]
            continue
        last_kind = None
        if item in EMBED_NAMES:
            names.append("hook_embed")
        elif item.startswith(("blocks.", "hook_")) or ("." in item and "@" not in item):
            names.append(item)  # a full name (ln_final.hook_scale, unembed.hook_in...): kinds have no dot
        elif "@" in item:
            kind, at = item.split("@", 1)
            hook_name(kind, 0)  # an unknown kind is refused with the closest valid ones
            names += [hook_name(kind, x) for x in _layer_item(at, n_layers, str(spec))]
            last_kind = kind
        else:
            names += [hook_name(item, x) for x in default]
    return list(dict.fromkeys(names))


def hook_names(model, spec, layers="all") -> list[str]:
    """`parse_hooks` for `model` (its number of layers)."""
    return parse_hooks(spec, int(model.cfg.n_layers), layers)


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
