import re

import pytest

from refengine.spec_decode.config import (
    ASYNC_ENV_VAR,
    SpeculativeConfig,
    resolve_async_scheduling,
)


@pytest.mark.parametrize(
    "method, compatible",
    [
        ("mtp", True),
        ("eagle", True),
        ("eagle3", True),
        ("dflash", True),
        ("ngram", False),
        ("draft_model", False),
    ],
)
def test_method_truth_table(method, compatible):
    spec = SpeculativeConfig(method, 4)
    assert spec.async_scheduling_compatible() is compatible
    auto = resolve_async_scheduling(None, spec, environ={})
    assert auto.enabled is compatible and auto.source == "auto"


def test_resolution_precedence_flag_env_auto():
    eagle = SpeculativeConfig("eagle", 4)
    assert resolve_async_scheduling(False, eagle, {ASYNC_ENV_VAR: "1"}).enabled is False
    assert resolve_async_scheduling(None, eagle, {ASYNC_ENV_VAR: "0"}).enabled is False
    assert resolve_async_scheduling(None, eagle, {ASYNC_ENV_VAR: "0"}).source == "env"
    assert resolve_async_scheduling(True, None, {ASYNC_ENV_VAR: "0"}).source == "flag"
    assert resolve_async_scheduling(None, None, {}).enabled is True


@pytest.mark.parametrize("flag, env", [(True, {}), (None, {ASYNC_ENV_VAR: "1"})])
def test_explicit_async_with_incompatible_method_is_refused(flag, env):
    with pytest.raises(ValueError, match="ngram"):
        resolve_async_scheduling(flag, SpeculativeConfig("ngram", 3), env)


def test_bad_env_value():
    with pytest.raises(ValueError, match=ASYNC_ENV_VAR):
        resolve_async_scheduling(None, None, {ASYNC_ENV_VAR: "yes"})


def test_parse_vllm_json():
    spec = SpeculativeConfig.from_json('{"method":"dflash","model":"/d","num_speculative_tokens":8}')
    assert (spec.method, spec.num_speculative_tokens, spec.model, spec.num_lookahead_slots) == (
        "dflash",
        8,
        "/d",
        9,
    )
    assert SpeculativeConfig.from_json('{"method":"deepseek_mtp","num_speculative_tokens":2}').method == "mtp"
    assert SpeculativeConfig("eagle", 3).num_lookahead_slots == 3


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"method":"medusa","num_speculative_tokens":2}', "unknown speculative method"),
        ('{"method":"eagle","num_speculative_tokens":0}', "num_speculative_tokens"),
        ('{"method":"eagle","num_speculative_tokens":"4"}', "num_speculative_tokens"),
        ('{"method":"eagle"}', "needs"),
        ('{"method":"eagle","num_speculative_tokens":2,"foo":1}', "unknown speculative-config keys: foo"),
        ('{"method":"dflash","num_speculative_tokens":4,"block_size":3}', "block_size"),
        ('{"method":"draft_model","num_speculative_tokens":4,"num_draft_layers":0}', "num_draft_layers"),
        ("[1]", "JSON object"),
        ("{", "not valid JSON"),
    ],
)
def test_bad_configs_get_clear_errors(text, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_json(text)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "medusa", "num_speculative_tokens": 2},
         "unknown speculative method 'medusa'; known methods: dflash, draft_model, eagle, eagle3, mtp, ngram"),
        ({"method": "eagle", "num_speculative_tokens": 65}, "num_speculative_tokens must be an integer in [1, 64], got 65"),
        ({"method": "eagle", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer in [1, 64], got 0"),
        ({"method": "eagle", "num_speculative_tokens": True}, "num_speculative_tokens must be an integer in [1, 64], got True"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "num_draft_layers": 0},
         "num_draft_layers must be a positive integer, got 0"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "num_draft_layers": "2"},
         "num_draft_layers must be a positive integer, got '2'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
         "need 1 <= prompt_lookup_min <= prompt_lookup_max, got 0, 4"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
         "need 1 <= prompt_lookup_min <= prompt_lookup_max, got 3, 2"),
        ({"method": "eagle", "num_speculative_tokens": 4, "block_size": 5}, "block_size applies to dflash only, not to 'eagle'"),
        ({"method": "dflash", "num_speculative_tokens": 4, "block_size": 4},
         "dflash block_size must equal num_speculative_tokens + 1 (5), got 4"),
        ({"method": "dflash", "num_speculative_tokens": 4, "target_layer_ids": []},
         "target_layer_ids must be non-negative layer indices, got ()"),
        ({"method": "dflash", "num_speculative_tokens": 4, "target_layer_ids": [1, -1]},
         "target_layer_ids must be non-negative layer indices, got (1, -1)"),
        ({"method": "dflash", "num_speculative_tokens": 4, "target_layer_ids": ["1"]},
         "target_layer_ids must be non-negative layer indices, got ('1',)"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "/d"}, "ngram takes no model"),
    ],
)
def test_validation_messages_name_the_field_and_the_value(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SpeculativeConfig(**kwargs)


def test_validation_accepts_the_edges():
    assert SpeculativeConfig("eagle", 64).num_speculative_tokens == 64
    assert SpeculativeConfig("eagle", 1).num_speculative_tokens == 1
    assert SpeculativeConfig("draft_model", 2, num_draft_layers=1).num_draft_layers == 1
    assert SpeculativeConfig("ngram", 2, prompt_lookup_min=3, prompt_lookup_max=3).prompt_lookup_min == 3
    assert SpeculativeConfig("dflash", 4, block_size=5, target_layer_ids=[0, 2]).target_layer_ids == (0, 2)
    assert SpeculativeConfig("eagle", 2, model="/d").model == "/d"
