"""What one soak run is told."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SoakConfig:
    model: str
    speculative_config: str | None
    concurrency: int
    duration_s: float
    sample_every_s: float
    window_s: float  # the first and last windows compared for RSS growth and TPOT drift
    max_num_seqs: int
    max_waiting_requests: int
    burst_every_s: float
    abort_fraction: float
    malformed_fraction: float
    num_slow_clients: int
    max_model_len: int
    threads: int | None
    seed: int
    counts_only: bool

    @property
    def capacity(self) -> int:
        return self.max_num_seqs + self.max_waiting_requests
