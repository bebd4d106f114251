"""Errors of the worker package."""


class RunnerInvariantError(RuntimeError):
    """The runner's per-request state contradicts what the scheduler sent."""
