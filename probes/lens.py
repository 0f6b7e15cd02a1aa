"""The logit lens: every layer's residual stream decoded through the model's own last steps.

The logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens") reads what a model would answer
if it stopped after block ``l``: the residual at ``blocks.{l}.hook_resid_post`` goes through the final
norm and the unembedding the model itself applies after its last block, and through whatever the
architecture does to its logits afterwards (Gemma 2's ``final_logit_softcapping``, Cohere's
``logit_scale``, Granite's ``logits_scaling``). The last block's ``hook_resid_post`` is the residual
*before* the final norm, so at the last layer the lens is the model's own logits: `logit_lens` checks
this on every forward it reads (``max_delta``) and refuses an architecture where it does not hold.

The residuals are captured by `hooks.capture` (the hooks every other reading uses); the norm and the
unembedding are the HF modules the model's forward runs (read through TransformerLens's wrappers where
the bridge is built, `models.forward.unwrapped`, so a wrapper never recomputes them). A tuned lens
(`probes.tuned_lens.TunedLens`, Belrose et al. 2023) adds one learned affine translator per layer before the
same decoder.

>>> import beliefscope as bs
>>> model, tok = bs.load_model("target")
>>> ids = tok("A coin is heads . Alice flips . State ?")["input_ids"]
>>> r = logit_lens(model, ids, tok=tok, classes=["heads", "tails"])
>>> r.class_share.shape, r.max_delta < 1e-5  # [layers, positions, classes]; last layer = the model's logits
((4, 10, 2), True)
>>> r.class_names[int(r.class_share[-1, -1].argmax())]  # the model's answer, read at the last layer
'tails'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..hooks import capture
from ..hooks.names import hf_of
from ..models.forward import unwrapped
from ..models.profile import compute_device

NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f")  # the final norm, by family
TOLERANCE = 1e-4  # most |lens - model logits| at the last layer before the lens is refused (float32 gives ~1e-6)


class LensDecoder(torch.nn.Module):
    """The model's own path from the residual stream after its last block to logits: final norm,
    unembedding, then the architecture's logit transform. Its modules are the model's (not copies)."""

    def __init__(self, model):
        super().__init__()
        hf = unwrapped(hf_of(model))  # the HF modules, read through TransformerLens's wrappers where built
        arch = type(hf).__name__
        self.unembed = unwrapped(hf.get_output_embeddings())  # [d_model] -> [d_vocab]
        if self.unembed is None:
            raise ValueError(f"{arch} has no output embedding (get_output_embeddings() is None): the lens decodes "
                             "through a causal LM's unembedding; load the model with its LM head")
        self.norm = unwrapped(final_norm(hf))
        c = hf.config
        self.softcap = getattr(c, "final_logit_softcapping", None)  # Gemma 2/3: cap * tanh(logits / cap)
        scale = float(getattr(c, "logit_scale", None) or 1.0) if arch.startswith("Cohere") else 1.0
        if getattr(c, "logits_scaling", None):  # Granite divides its logits
            scale /= float(c.logits_scaling)
        self.scale = scale
        self.arch = arch

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., d_vocab]`` of residuals ``[..., d_model]`` (float32 out)."""
        x = self.norm(resid.to(compute_device(self.norm)))
        logits = self.unembed(x.to(compute_device(self.unembed))).float()
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def final_norm(hf) -> torch.nn.Module:
    """The norm a HF causal LM applies after its last block (`NORM_NAMES` on its base model, or on the base
    model's ``decoder`` as OPT nests it); refused, naming the architecture, where there is none."""
    base = hf.base_model
    for holder in (base, getattr(base, "decoder", None)):
        for name in NORM_NAMES:
            module = getattr(holder, name, None) if holder is not None else None
            if isinstance(module, torch.nn.Module):
                return module
    raise ValueError(f"cannot find the final norm of {type(hf).__name__} (looked for {', '.join(NORM_NAMES)} on its "
                     "base model): the lens supports decoders whose last step is norm then unembedding")


def check_layers(model, layers) -> list[int]:
    """Block indices to read: ``"all"`` / None, an int, or ints (negative count from the end); one out of
    range is refused before any forward."""
    n = model.cfg.n_layers
    if layers is None or layers == "all":
        return list(range(n))
    want = [layers] if isinstance(layers, int) else list(layers)
    bad = [x for x in want if not isinstance(x, (int, np.integer)) or not -n <= int(x) < n]
    if bad or not want:
        raise ValueError(f"layers {bad or want} out of range: this model has blocks 0..{n - 1} (the lens reads "
                         f"blocks.L.hook_resid_post); pass layers in 0..{n - 1} (or -1 for the last), or 'all'")
    return sorted({int(x) % n for x in want})


def class_token_ids(tok, names) -> list[int]:
    """The token of " <name>" for each class word; a word that is not exactly one token is refused (its
    probability under the lens would be that of a fragment), and so are two words with one token."""
    if tok is None:
        raise ValueError("class words need the model's tokenizer: pass tok=")
    ids = []
    for name in names:
        got = tok(" " + str(name), add_special_tokens=False)["input_ids"]
        if len(got) != 1:
            pieces = [tok.decode([i]) for i in got]
            raise ValueError(f"class word {name!r} is {len(got)} tokens under this tokenizer ({pieces}): the lens "
                             "reads one token per class; pass answer words that are one token each (e.g. the first "
                             f"word of each class, or --answers with single-token words)")
        ids.append(int(got[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"class words {list(names)} share a token under this tokenizer: pass distinct words")
    return ids


@dataclass
class LensReading:
    """What every layer would answer at every position of one text."""

    layers: list[int]  # [L] block index of each row (its hook_resid_post)
    ids: np.ndarray  # [T] token ids read
    top_id: np.ndarray  # [L, T] the lens's most likely next token
    top_p: np.ndarray  # [L, T] its probability
    kl: np.ndarray  # [L, T] KL(model's final distribution || lens distribution), nats
    class_names: list[str]  # [K] the class words (empty: none asked for)
    class_p: np.ndarray  # [L, T, K] probability of each class word under the lens (full-vocabulary softmax)
    class_share: np.ndarray  # [L, T, K] the same renormalised over the class words (what a forced answer reads)
    max_delta: float  # max |lens logits - model logits| at the last block (0 up to rounding)
    tuned: bool = False  # read through a tuned lens (else the logit lens)


def residuals(model, ids: torch.Tensor, layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of ``ids [B, T]``: ``(resid [L, B, T, d_model] at each block's hook_resid_post, the model's
    logits [B, T, d_vocab])``, captured through `hooks.capture`."""
    names = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    with torch.no_grad(), capture(model, names) as cap:
        logits = model(ids, return_type="logits")
    return torch.stack([cap.stacked(n) for n in names]), logits


@torch.no_grad()
def read_residuals(decoder, resid, final, layers, class_ids=(), lens=None):
    """Lens statistics of residuals ``resid [L, N, d]`` against the final logits ``final [N, V]``: a dict of
    ``top_id, top_p, kl [L, N]``, ``class_p, class_share [L, N, K]``. One layer at a time (``[N, V]`` at once)."""
    final_lp = torch.log_softmax(final.float(), -1)  # [N, V]
    out = {k: [] for k in ("top_id", "top_p", "kl", "class_p", "class_share")}
    cls = torch.as_tensor(list(class_ids), dtype=torch.long)
    for i, layer in enumerate(layers):
        h = resid[i]
        if lens is not None:
            h = lens.translate(h, layer)
        lp = torch.log_softmax(decoder(h).to(final_lp.device), -1)  # [N, V]
        top = lp.max(-1)
        out["top_id"].append(top.indices)
        out["top_p"].append(top.values.exp())
        out["kl"].append((final_lp.exp() * (final_lp - lp)).sum(-1))
        sel = lp[:, cls.to(lp.device)]  # [N, K]
        out["class_p"].append(sel.exp())
        out["class_share"].append(torch.softmax(sel, -1))
    return {k: torch.stack(v).cpu().numpy() for k, v in out.items()}


@torch.no_grad()
def check_last_layer(decoder: LensDecoder, resid: torch.Tensor, final: torch.Tensor) -> float:
    """max |lens logits - model logits| of the last block's residuals ``[..., d]`` against the model's own logits
    ``[..., V]``; refused (the lens would misread every layer) beyond `TOLERANCE`."""
    delta = float((decoder(resid).to(final.device) - final.float()).abs().max())
    if delta > TOLERANCE * max(1.0, float(final.abs().max())):
        raise ValueError(f"the lens at the last block differs from {decoder.arch}'s own logits by {delta:.3g}: this "
                         "architecture does more after its final norm than the lens knows (softcapping, scaling); "
                         "the lens cannot read it faithfully")
    return delta


@torch.no_grad()
def logit_lens(model, ids, *, tok=None, classes=(), layers="all", lens=None) -> LensReading:
    """Every block's answer at every position of ``ids`` (``[T]`` token ids, or a text with `tok`).

    ``classes``: class words whose probabilities are read (each one token, `class_token_ids`); ``layers``:
    blocks to read (``"all"``); ``lens``: a `TunedLens` of this model (None: the logit lens). Every input is
    checked before the forward. The last block is always read, to check the lens against the model's logits."""
    layer_list = check_layers(model, layers)
    class_ids = class_token_ids(tok, classes) if classes else []
    if lens is not None:
        lens.check_model(model)
    if isinstance(ids, str):
        if tok is None:
            raise ValueError("a text needs the model's tokenizer: pass tok=, or token ids")
        ids = tok(ids)["input_ids"]
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long).reshape(1, -1)  # [1, T]
    if x.shape[1] == 0:
        raise ValueError("no tokens to read: pass a non-empty text or ids")
    last = model.cfg.n_layers - 1
    read = sorted(set(layer_list) | {last})
    decoder = LensDecoder(model)
    resid, logits = residuals(model, x.to(compute_device(decoder.unembed)), read)  # [L, 1, T, d], [1, T, V]
    final = logits[0].float()
    delta = check_last_layer(decoder, resid[read.index(last), 0], final)
    keep = [read.index(layer) for layer in layer_list]
    stats = read_residuals(decoder, resid[keep, 0], final, layer_list, class_ids, lens)
    return LensReading(layers=layer_list, ids=x[0].numpy(), class_names=[str(c) for c in classes], max_delta=delta,
                       tuned=lens is not None, **stats)
