import pytest

from refengine.spec.config import (
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
