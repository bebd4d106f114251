"""Tokenizers built from GGUF metadata or HF folders, incremental detokenization, chat templates."""

from refengine.tokenizer.chat_template import ChatMessage, ChatTemplate
from refengine.tokenizer.detokenizer import IncrementalDetokenizer
from refengine.tokenizer.errors import ChatTemplateError, TokenizerError
from refengine.tokenizer.gguf_vocab import GgufVocab
from refengine.tokenizer.tokenizer import Tokenizer

__all__ = [
    "ChatMessage",
    "ChatTemplate",
    "ChatTemplateError",
    "GgufVocab",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerError",
]
