import pytest

from refengine.config import EngineConfig
from refengine.core.async_scheduler import AsyncScheduler
from refengine.core.scheduler import Scheduler
from refengine.spec_decode.config import SpeculativeConfig

from .harness import Spec


def test_defaults_validate():
    config = EngineConfig()
    config.validate()
    assert config.num_speculative_tokens == 0 and config.num_lookahead_tokens == 0


def test_speculative_config_supplies_k_and_lookahead():
    dflash = SpeculativeConfig(method="dflash", num_speculative_tokens=7)
    config = EngineConfig(speculative_config=dflash)
    assert (config.num_speculative_tokens, config.num_lookahead_tokens) == (7, 8)
    eagle = EngineConfig(speculative_config=SpeculativeConfig(method="eagle", num_speculative_tokens=3))
    assert eagle.num_lookahead_tokens == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_batched_tokens": 0}, r"max_num_batched_tokens must be an integer >= 1, got 0"),
        ({"max_num_seqs": 0}, r"max_num_seqs .* got 0"),
        ({"block_size": -4}, r"block_size .* got -4"),
        ({"num_blocks": 2.0}, r"num_blocks .* got 2\.0"),
        ({"max_model_len": True}, r"max_model_len .* got True"),
        ({"max_model_len": 1}, r"max_model_len=1 leaves no room"),
        ({"long_prefill_token_threshold": -1}, r"long_prefill_token_threshold must be an integer >= 0, got -1"),
        ({"seed": "0"}, r"seed must be an integer, got '0'"),
        ({"async_scheduling": 1}, r"async_scheduling must be a bool, got 1"),
        ({"speculative_config": Spec(-1, 0)}, r"num_speculative_tokens >= 0 .* got -1 and 0"),
        (
            {"max_model_len": 100, "block_size": 16, "num_blocks": 6},
            r"max_model_len=100 \+ 0 lookahead slots = 100 tokens needs 7 blocks of block_size=16, "
            r"but num_blocks=6 holds only 96 tokens",
        ),
    ],
)
def test_config_that_cannot_serve_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs).validate()


def test_lookahead_counts_against_the_pool():
    fits = EngineConfig(max_model_len=64, block_size=16, num_blocks=4)
    fits.validate()
    dflash = SpeculativeConfig(method="dflash", num_speculative_tokens=3)
    with pytest.raises(ValueError, match=r"64 \+ 4 lookahead slots = 68 tokens needs 5 blocks"):
        EngineConfig(max_model_len=64, block_size=16, num_blocks=4, speculative_config=dflash).validate()


def test_schedulers_validate_and_match_the_async_flag():
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(EngineConfig(max_num_seqs=0))
    with pytest.raises(ValueError, match="async_scheduling=True needs AsyncScheduler, not Scheduler"):
        Scheduler(EngineConfig(async_scheduling=True))
    with pytest.raises(ValueError, match="async_scheduling=False needs Scheduler, not AsyncScheduler"):
        AsyncScheduler(EngineConfig())
    assert AsyncScheduler(EngineConfig(async_scheduling=True)).async_scheduling()
    assert not Scheduler(EngineConfig()).async_scheduling()
