"""Errors raised by the model package."""


class ModelLoadError(Exception):
    """A model file or folder cannot be turned into a model.

    The message is one line naming what is wrong: the file, the tensor, the key or the architecture.
    """


class ModelInputError(ValueError):
    """A forward call received inputs that contradict each other or the KV cache."""
