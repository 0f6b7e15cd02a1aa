"""Models: load any causal LM as a TransformerBridge, train the toy models, evaluate them.

>>> from beliefscope.models import load_model
>>> bridge, tok = load_model("draft")
>>> bridge.cfg.n_layers
1
"""

from beliefscope.models.bridge import guard_cache_handoff as guard
from beliefscope.models.load import (
    SHIPPED,
    ModelLoadError,
    bridge_from_hf,
    checkpoint_path,
    default_device,
    load_hf,
    load_model,
    resolve_store,
    shipped_names,
)
from beliefscope.models.profile import ModelProfile, ModelShapes, hf_of, model_profile, model_shapes, writes_thoughts
from beliefscope.models.runner import Runner

__all__ = ["SHIPPED", "ModelLoadError", "ModelProfile", "ModelShapes", "Runner", "bridge_from_hf", "checkpoint_path",
           "default_device", "guard", "hf_of", "load_hf", "load_model", "model_profile", "model_shapes",
           "resolve_store", "shipped_names", "writes_thoughts"]
