"""Errors of model loading, shared by the loaders and the bridge builder."""


class ModelLoadError(RuntimeError):
    """A model name or path could not be loaded; the message says why and what to do."""
