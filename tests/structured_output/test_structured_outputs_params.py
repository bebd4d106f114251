"""StructuredOutputsParams: exactly one constraint, refused by name otherwise; a cache key that does not
depend on how a schema is spelled; and the combinations SamplingParams refuses."""

import json
import sys

import pytest

from refengine.sampling_params import SamplingParams, StructuredOutputsParams
from refengine.structured_output.backend import StructuredOutputUnavailable, llguidance


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"exactly one of .* got none"),
        ({"regex": "a", "choice": ["b"]}, r"exactly one of .* got \['regex', 'choice'\]"),
        ({"json": "{not json"}, r"json is not valid JSON"),
        ({"json": 3}, r"json must be a JSON schema object"),
        ({"regex": 5}, r"regex must be a string"),
        ({"choice": []}, r"choice must hold at least one string"),
        ({"choice": "ab"}, r"choice must be a list of strings"),
        ({"json_object": False}, r"got none"),
    ],
)
def test_malformed_constraints_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"regex": "a", "json_object": True},
            "StructuredOutputsParams needs exactly one of json, regex, choice, grammar or json_object, "
            "got ['regex', 'json_object']",
        ),
        ({"choice": []}, "StructuredOutputsParams.choice must hold at least one string"),
    ],
)
def test_messages_are_exact(kwargs, message):
    # The whole message: it is what a client reads in the 400 answer.
    with pytest.raises(ValueError) as info:
        StructuredOutputsParams(**kwargs)
    assert str(info.value) == message


def test_json_object_alone_is_the_constraint():
    assert StructuredOutputsParams(json_object=True).key == ("json_object", "")


def test_the_cache_key_ignores_the_spelling_of_a_schema():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
    keys = {
        StructuredOutputsParams(json=schema).key,
        StructuredOutputsParams(json=json.dumps(schema, indent=2)).key,
        StructuredOutputsParams(json=dict(reversed(list(schema.items())))).key,
    }
    assert len(keys) == 1
    assert StructuredOutputsParams(regex="a").key != StructuredOutputsParams(grammar="a").key


@pytest.mark.parametrize("extra", [{"min_tokens": 2}, {"bad_words": ["x"]}, {"bad_words_token_ids": [[3]]}])
def test_constraints_that_could_mask_every_allowed_token_are_refused(extra):
    # The whole one-line message: it is what a client reads in the 400 answer.
    with pytest.raises(
        ValueError, match=r"^SamplingParams\.structured_outputs cannot be combined with min_tokens or bad_words$"
    ):
        SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a"]), **extra)
    with pytest.raises(
        ValueError,
        match=r"^SamplingParams\.structured_outputs must be a StructuredOutputsParams, got \{'choice': \['a'\]\}$",
    ):
        SamplingParams(structured_outputs={"choice": ["a"]})


def test_a_missing_backend_is_a_one_line_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # what an environment without the extra sees
    with pytest.raises(StructuredOutputUnavailable, match=r"install the `structured` extra") as info:
        llguidance()
    assert "\n" not in str(info.value)
