"""The cache's side of the model guard: which models `KVCache.for_model` accepts, and how it reads their
shapes. The guard itself (the cache hand-off, input placement, the growth check) is
``beliefscope.models.guard``; the loaders install it once, and building a cache never changes a model."""

from __future__ import annotations

# Set on a model (and on the HF model under a bridge) by the model guard, ``beliefscope.models.guard``,
# which `load_model` installs: the function reading the model's shapes (``models.profile.model_shapes``).
# The cache reads it and never installs the guard itself.
GUARD = "_beliefscope_cache_guard"


class UnguardedModelError(TypeError):
    """A cache was asked for a model without the guard that checks its attention writes the cache."""


def shapes_of_guarded(model):
    """The shapes a guarded ``model`` reports (layers, KV heads, head size, dtype, device, windows...).
    An unguarded model is refused: its attention could ignore the cache with no error."""
    read = vars(model).get(GUARD) if hasattr(model, "__dict__") else None
    if not callable(read):
        raise UnguardedModelError(
            f"KVCache.for_model: this {type(model).__name__} has no cache guard, so nothing would check that "
            "its attention writes the cache. Load it with beliefscope.models.load_model(...), or call "
            "beliefscope.models.guard(model) once before building a cache for it.")
    return read(model)
