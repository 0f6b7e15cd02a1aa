"""Hook names, capture and steering on a TransformerBridge, in TransformerLens style."""

from .activation_cache import decomposition_hooks, to_activation_cache
from .capture import Capture, Record, capture, hooked, steer, stream
from .names import SHORT_NAMES, hook_name, hook_names, layer_names, parse_hooks, resolve_hook

__all__ = ["SHORT_NAMES", "Capture", "Record", "capture", "decomposition_hooks", "hook_name", "hooked", "hook_names",
           "layer_names", "parse_hooks", "resolve_hook", "steer", "stream", "to_activation_cache"]
