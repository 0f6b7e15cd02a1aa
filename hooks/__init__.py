"""Hook names, capture and steering on a TransformerBridge, in TransformerLens style."""

from hooks.capture import Capture, Record, capture, hooked, steer
from hooks.names import SHORT_NAMES, hook_name, layer_names, resolve_hook

__all__ = ["Capture", "Record", "capture", "hooked", "steer", "SHORT_NAMES", "hook_name", "layer_names",
           "resolve_hook"]
