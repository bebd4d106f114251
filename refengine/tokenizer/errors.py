"""Errors raised by the tokenizer package."""


class TokenizerError(Exception):
    """A vocabulary or tokenizer file that cannot be turned into a tokenizer; the message names why."""


class ChatTemplateError(ValueError):
    """The chat template rejected the messages (its `raise_exception`) or failed to render them."""
