"""EngineConfig: the engine's limits and pool sizes; every default lives here."""

from dataclasses import dataclass
from typing import Protocol


class SpeculativeSettings(Protocol):
    """The part of a speculative config the scheduler and KV manager read
    (refengine.spec_decode.config.SpeculativeConfig provides it)."""

    @property
    def num_speculative_tokens(self) -> int: ...

    @property
    def num_lookahead_slots(self) -> int: ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    # A prompt is prefilled at most this many tokens per step (0: no cap, only the budget), as vLLM's
    # long_prefill_token_threshold; it never cuts a verify step's drafts.
    long_prefill_token_threshold: int = 0
    max_model_len: int = 2048
    block_size: int = 16
    num_blocks: int = 1024
    seed: int = 0
    speculative_config: SpeculativeSettings | None = None
    async_scheduling: bool = False
    # vLLM v1's automatic prefix caching, on by default as there.
    enable_prefix_caching: bool = True

    @property
    def num_speculative_tokens(self) -> int:
        spec = self.speculative_config
        return 0 if spec is None else spec.num_speculative_tokens

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens for the drafter (k, or k + 1 for dflash)."""
        spec = self.speculative_config
        return 0 if spec is None else spec.num_lookahead_slots

    def validate(self) -> None:
        """Refuse a configuration that cannot serve, naming the numbers that do not fit."""
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")
        threshold = self.long_prefill_token_threshold
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ValueError(f"EngineConfig.long_prefill_token_threshold must be an integer >= 0, got {threshold!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"EngineConfig.seed must be an integer, got {self.seed!r}")
        for name in ("async_scheduling", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.max_model_len < 2:
            raise ValueError(
                f"EngineConfig.max_model_len={self.max_model_len} leaves no room for a prompt token "
                "and a generated token (need >= 2)"
            )
        k, lookahead = self.num_speculative_tokens, self.num_lookahead_tokens
        if k < 0 or lookahead < 0:
            raise ValueError(
                f"speculative_config must give num_speculative_tokens >= 0 and num_lookahead_slots >= 0, "
                f"got {k} and {lookahead}"
            )
        # A lone request must always fit, or preemption could never make progress.
        max_seq_tokens = self.max_model_len + lookahead
        blocks_needed = -(-max_seq_tokens // self.block_size)
        if blocks_needed > self.num_blocks:
            raise ValueError(
                f"one sequence of max_model_len={self.max_model_len} + {lookahead} lookahead slots = "
                f"{max_seq_tokens} tokens needs {blocks_needed} blocks of block_size={self.block_size}, "
                f"but num_blocks={self.num_blocks} holds only {self.num_blocks * self.block_size} tokens"
            )
