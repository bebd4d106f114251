"""The tokenizer the engine uses: byte-level BPE ids <-> text, plus the chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from refengine.tokenizer.byte_alphabet import CHAR_TO_BYTE
from refengine.tokenizer.chat_template import ChatMessage, ChatTemplate
from refengine.tokenizer.errors import TokenizerError
from refengine.tokenizer.gguf_vocab import GgufVocab, build_backend


def _byte_of(char: str) -> bytes:
    # A character outside the byte alphabet (rare, in hand-added vocab entries) stands for itself.
    byte = CHAR_TO_BYTE.get(char)
    return char.encode() if byte is None else bytes((byte,))


class Tokenizer:
    def __init__(
        self,
        backend: Backend,
        *,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos: bool,
        chat_template: str | None,
    ) -> None:
        if not isinstance(backend.decoder, decoders.ByteLevel):
            raise TokenizerError("only byte-level BPE tokenizers are supported (decoder is not ByteLevel)")
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.add_bos = add_bos
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in added.items() if token.special)
        self._added_text = {i: token.content for i, token in added.items()}
        self._token_bytes: dict[int, bytes] = {}
        self.chat_template = (
            None
            if chat_template is None
            else ChatTemplate(
                chat_template,
                bos_token=self._text_of(bos_token_id),
                eos_token=self._text_of(eos_token_ids[0] if eos_token_ids else None),
            )
        )

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry as spelled in the vocabulary (byte-level alphabet), None if out of range."""
        return self._backend.id_to_token(token_id)

    def to_json(self) -> str:
        """The tokenizer in the `tokenizers` library's JSON form (what grammar backends read)."""
        return self._backend.to_str()

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for; an added token stands for its literal text."""
        cached = self._token_bytes.get(token_id)
        if cached is None:
            if token_id in self._added_text:
                cached = self._added_text[token_id].encode()
            else:
                piece = self._backend.id_to_token(token_id)
                if piece is None:
                    raise TokenizerError(
                        f"token id {token_id} is outside the vocabulary of {self.vocab_size}"
                    )
                cached = b"".join(_byte_of(char) for char in piece)
            self._token_bytes[token_id] = cached
        return cached

    def apply_chat_template(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> str:
        if self.chat_template is None:
            raise TokenizerError("this model's tokenizer has no chat template")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def _text_of(self, token_id: int | None) -> str:
        return "" if token_id is None else self._backend.id_to_token(token_id) or ""

    @classmethod
    def from_gguf_vocab(cls, vocab: GgufVocab) -> Tokenizer:
        return cls(
            build_backend(vocab),
            bos_token_id=vocab.bos_token_id,
            eos_token_ids=vocab.eos_token_ids,
            add_bos=vocab.add_bos,
            chat_template=vocab.chat_template,
        )

    @classmethod
    def from_hf_folder(cls, folder: Path, eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
        """`tokenizer.json`, with `tokenizer_config.json` and `chat_template.jinja` when present.

        `eos_token_ids` (from the model's config) take precedence over the tokenizer config's eos token.
        """
        try:
            backend = Backend.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # the tokenizers library raises bare Exceptions
            raise TokenizerError(f"{folder / 'tokenizer.json'}: cannot be read ({err})") from err
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template_path = folder / "chat_template.jinja"
        chat_template = template_path.read_text() if template_path.exists() else config.get("chat_template")
        if isinstance(chat_template, list):  # named templates: the default one is the chat template
            chat_template = next((t["template"] for t in chat_template if t.get("name") == "default"), None)
        bos_id = _token_id(backend, config.get("bos_token"))
        eos_id = _token_id(backend, config.get("eos_token"))
        return cls(
            backend,
            bos_token_id=bos_id,
            eos_token_ids=eos_token_ids or (() if eos_id is None else (eos_id,)),
            add_bos=_adds_bos(backend, config, bos_id),
            chat_template=chat_template,
        )

    def save_hf_folder(self, folder: Path) -> None:
        self._backend.save(str(folder / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self._text_of(self.bos_token_id) or None,
            "eos_token": self._text_of(self.eos_token_ids[0] if self.eos_token_ids else None) or None,
            "add_bos_token": self.add_bos,
            "chat_template": None if self.chat_template is None else self.chat_template.source,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))

    @classmethod
    def byte_level(
        cls, vocab_size: int, special_tokens: Sequence[str], eos_token: str, chat_template: str | None
    ) -> Tokenizer:
        """A merge-free byte tokenizer: ids 0..255 are bytes, then `special_tokens`, then reserved
        specials up to `vocab_size`. Small enough for random-weight test models."""
        num_named = 256 + len(special_tokens)
        if vocab_size < num_named:
            raise TokenizerError(
                f"vocab_size {vocab_size} < 256 bytes + {len(special_tokens)} special tokens"
            )
        if eos_token not in special_tokens:
            raise TokenizerError(f"eos token {eos_token!r} is not among the special tokens")
        byte_chars = sorted(CHAR_TO_BYTE, key=CHAR_TO_BYTE.__getitem__)
        specials = [*special_tokens, *(f"<|reserved_{i}|>" for i in range(vocab_size - num_named))]
        return cls.from_byte_vocab({char: i for i, char in enumerate(byte_chars)}, specials, eos_token, chat_template)

    @classmethod
    def from_byte_vocab(
        cls, vocab: dict[str, int], special_tokens: Sequence[str], eos_token: str, chat_template: str | None
    ) -> Tokenizer:
        """Merge-free byte-level BPE over `vocab` (byte-spelled entries), with `special_tokens` matched
        whole (appended after `vocab` unless it holds them already)."""
        backend = Backend(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
        return cls(
            backend,
            bos_token_id=None,
            eos_token_ids=(backend.token_to_id(eos_token),),
            add_bos=False,
            chat_template=chat_template,
        )


def _adds_bos(backend: Backend, config: dict, bos_id: int | None) -> bool:
    """tokenizer_config's flag, else whether tokenizer.json's post-processor puts BOS first (Llama 3)."""
    if "add_bos_token" in config:
        return bool(config["add_bos_token"])
    return bos_id is not None and backend.encode("a", add_special_tokens=True).ids[:1] == [bos_id]


def _token_id(backend: Backend, token: str | dict | None) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    return None if token is None else backend.token_to_id(token)
