"""The structured variant of the oracle: each request follows a JSON schema, a regex or a choice set, and
its output is checked on its own: the text parses or matches, every token was one its grammar allowed
where it stood, and the grammar, not max_tokens, ended it."""

import json
import re
from collections.abc import Sequence

import numpy as np

from refengine.sampling_params import StructuredOutputsParams
from refengine.structured_output.manager import StructuredOutputManager

# Each constraint leaves room for free text (ASCII words, one byte a character on the tiny byte
# tokenizer), where a trained drafter's drafts can be accepted: a structured arm of a real head must
# show accepted drafts under the grammar's masks, not only drafts cut by it.
FREE_TEXT_CHARS = 80
FREE_TEXT = f"[A-Za-z ,]{{1,{FREE_TEXT_CHARS}}}"
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "reason": {"type": "string", "pattern": f"^{FREE_TEXT}$"},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
    },
    "required": ["answer", "reason", "score", "tags"],
    "additionalProperties": False,
}
REGEX = rf"(yes|no), {FREE_TEXT}\."
CHOICES = ("Paris", "Rome", "New York")
# Request i follows constraint i % 3.
CONSTRAINTS = (
    StructuredOutputsParams(json=SCHEMA),
    StructuredOutputsParams(regex=REGEX),
    StructuredOutputsParams(choice=list(CHOICES)),
)
# Enough for every constraint to end by its grammar on the tiny byte tokenizer (one token a byte).
MAX_TOKENS = 192


def text_violations(constraint: StructuredOutputsParams, text: str) -> list[str]:
    """The text parses (JSON, with the schema's required keys and enums) or matches (regex, choice)."""
    if constraint.regex is not None:
        return [] if re.fullmatch(constraint.regex, text) else [f"{text!r} does not match {constraint.regex!r}"]
    if constraint.choice is not None:
        return [] if text in constraint.choice else [f"{text!r} is none of {constraint.choice}"]
    try:
        value = json.loads(text)
    except ValueError as err:
        return [f"{text!r} is not JSON: {err}"]
    schema = constraint.json
    if not isinstance(value, dict) or set(value) != set(schema["required"]):
        return [f"{text!r} does not have exactly the keys {schema['required']}"]
    found = []
    for key, spec in schema["properties"].items():
        if "enum" in spec and value[key] not in spec["enum"]:
            found.append(f"{key}={value[key]!r} is none of {spec['enum']}")
    return found


def grammar_replay(
    manager: StructuredOutputManager, constraint: StructuredOutputsParams, output: Sequence[int]
) -> tuple[np.ndarray, list[str], bool]:
    """A fresh matcher walked through the output: the bitmask each position was sampled under, the
    tokens it forbade (an emitted token that was masked), and whether the grammar ended the output."""
    grammar = manager.request(constraint).grammar
    bitmask = np.full((len(output), (manager.vocab_size + 31) // 32), -1, dtype=np.int32)
    for i, token in enumerate(output):
        grammar.fill_bitmask(bitmask, i)
        if not (int(bitmask[i, token // 32]) >> (token % 32)) & 1:
            return bitmask, [f"output position {i}: token {token} was masked by its grammar"], False
        grammar.accept_tokens([token])
    return bitmask, [], grammar.is_terminated()
