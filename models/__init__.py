"""Models: load any causal LM as a Runner (its HF model, guarded; TransformerLens's bridge when a hook name needs
it), train the toy models, evaluate them.

>>> from beliefscope.models import load_model
>>> model, tok = load_model("draft")
>>> model.cfg.n_layers, model.built
(1, False)
"""

from .bridge import guard_cache_handoff as guard
from .forward import forward_module
from .load import (
    SHIPPED,
    ModelLoadError,
    bridge_from_hf,
    checkpoint_path,
    default_device,
    load_hf,
    load_model,
    model_defaults,
    resolve_store,
    shipped_names,
)
from .profile import ModelProfile, ModelShapes, hf_of, model_profile, model_shapes, writes_thoughts
from .runner import Runner
from .tokenizer import toy_tokenizer

__all__ = [
    "ModelLoadError",
    "ModelProfile",
    "ModelShapes",
    "Runner",
    "SHIPPED",
    "bridge_from_hf",
    "checkpoint_path",
    "default_device",
    "guard",
    "hf_of",
    "load_hf",
    "load_model",
    "model_defaults",
    "model_profile",
    "model_shapes",
    "resolve_store",
    "forward_module",
    "shipped_names",
    "toy_tokenizer",
    "writes_thoughts",
]
