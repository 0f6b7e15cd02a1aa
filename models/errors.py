"""Errors of model loading and running, shared by the loaders, the bridge builder and the forward door."""


class ModelLoadError(RuntimeError):
    """A model name or path could not be loaded; the message says why and what to do."""


class ThoughtsSkippedError(TypeError):
    """A Thinking States model was handed to a path that runs its HF model directly, which would answer
    without the model's thoughts; the message names the path that reads it as it runs."""
