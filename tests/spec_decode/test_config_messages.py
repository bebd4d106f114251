"""Exact messages and reasons of SpeculativeConfig parsing and async-scheduling resolution.

The CLI and the server print these strings to the user as the one-line error or the startup
reason, so their wording is part of the interface: each is asserted whole, not by a loose word.
"""

import re

import pytest

from refengine.spec_decode.config import (
    ASYNC_ENV_VAR,
    AsyncResolution,
    SpeculativeConfig,
    resolve_async_scheduling,
)


def test_from_json_refuses_a_non_object_with_the_exact_message():
    with pytest.raises(ValueError, match=r"^--speculative-config must be a JSON object$"):
        SpeculativeConfig.from_json("[1, 2]")


def test_from_dict_refuses_the_internal_extra_field_as_an_unknown_key():
    # `extra` is a dataclass field for internal use only; a user must not be able to set it.
    with pytest.raises(ValueError, match=r"^unknown speculative-config keys: extra$"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "extra": {}})


def test_from_dict_lists_several_unknown_keys_sorted_and_comma_separated():
    data = {"method": "ngram", "num_speculative_tokens": 2, "zeta": 1, "alpha": 2}
    with pytest.raises(ValueError, match=r"^unknown speculative-config keys: alpha, zeta$"):
        SpeculativeConfig.from_dict(data)


def test_from_dict_needs_method_and_k_with_the_exact_message():
    expected = r"^speculative-config needs 'method' and 'num_speculative_tokens'$"
    with pytest.raises(ValueError, match=expected):
        SpeculativeConfig.from_dict({"method": "ngram"})
    with pytest.raises(ValueError, match=expected):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 2})


def test_empty_env_var_counts_as_unset():
    # An exported but empty REFENGINE_ASYNC_SCHEDULING= must fall through to the automatic choice,
    # not be refused as a value other than 0 or 1.
    resolution = resolve_async_scheduling(None, None, {ASYNC_ENV_VAR: ""})
    assert resolution == AsyncResolution(True, "auto", "on: no speculative decoding is compatible")


def test_refusal_message_names_source_method_and_reason():
    spec = SpeculativeConfig("ngram", 3)
    expected = (
        "async scheduling was requested (env) but speculative method 'ngram' "
        "needs synchronous scheduling (its drafter reads committed tokens on the host)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        resolve_async_scheduling(None, spec, {ASYNC_ENV_VAR: "1"})


@pytest.mark.parametrize(
    ("flag", "spec", "environ", "expected"),
    [
        # automatic choice: the reason names the method (or its absence)
        (None, None, {}, AsyncResolution(True, "auto", "on: no speculative decoding is compatible")),
        (
            None,
            SpeculativeConfig("eagle", 2),
            {},
            AsyncResolution(True, "auto", "on: method 'eagle' is compatible"),
        ),
        (
            None,
            SpeculativeConfig("draft_model", 2),
            {},
            AsyncResolution(False, "auto", "off: method 'draft_model' forces synchronous scheduling"),
        ),
        # explicit choices: the reason names who set it
        (True, None, {}, AsyncResolution(True, "flag", "on: set by flag")),
        (False, SpeculativeConfig("mtp", 2), {}, AsyncResolution(False, "flag", "off: set by flag")),
        (None, None, {ASYNC_ENV_VAR: "1"}, AsyncResolution(True, "env", "on: set by env")),
        (
            None,
            SpeculativeConfig("ngram", 2),
            {ASYNC_ENV_VAR: "0"},
            AsyncResolution(False, "env", "off: set by env"),
        ),
    ],
)
def test_resolution_reason_is_exact(flag, spec, environ, expected):
    assert resolve_async_scheduling(flag, spec, environ) == expected
