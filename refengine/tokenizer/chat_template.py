"""Rendering a model's Jinja chat template, sandboxed as HF does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from refengine.tokenizer.errors import ChatTemplateError, TokenizerError


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as err:
            raise TokenizerError(f"chat template does not compile: {err}") from err
        self.source = source
        self._bos_token = bos_token
        self._eos_token = eos_token

    def render(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as err:
            raise ChatTemplateError(f"chat template failed: {err}") from err
