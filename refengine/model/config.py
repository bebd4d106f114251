"""The hyperparameters of a decoder-only transformer, whatever file they came from."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from refengine.model.errors import ModelLoadError


class Numerics(enum.StrEnum):
    """How the model trades speed for reproducibility on CPU.

    BATCH_INVARIANT: a token's result is bitwise independent of the other tokens in the step and of
    how many of its own sequence's tokens arrive together. FAST: plain batched kernels.
    """

    BATCH_INVARIANT = "batch_invariant"
    FAST = "fast"


ATTENTION_BACKENDS = ("auto", "triton", "reference")


@dataclass(frozen=True, slots=True)
class Kernels:
    """Which implementations run for CUDA tensors; the CPU always runs the reference torch ops. An
    engine argument, held by the modules that choose (set_kernels), never a process-wide switch.

    attention: auto (the Triton kernels when triton is installed), triton, or reference.
    fused_ops: the fused Triton token-local ops of triton_ops.py (RMSNorm, q/k norm with the rotary
    embedding, SiLU-and-multiply, residual add with the next norm).
    skinny_gemm: under fast numerics, skinny_linear.py's kernel for products of 1..8 float32 rows."""

    attention: str = "auto"
    fused_ops: bool = True
    skinny_gemm: bool = True

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention!r}"
            )


DEFAULT_KERNELS = Kernels()


class Arch(enum.StrEnum):
    LLAMA = "llama"
    QWEN3 = "qwen3"


@dataclass(frozen=True, slots=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent stretching of the rotary wavelengths."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    arch: Arch
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        positive = (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings",
        )  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if value <= 0:
                raise ModelLoadError(f"model config: {name} must be positive, got {value}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(
                f"model config: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelLoadError(
                f"model config: rotary embeddings need an even head_dim, got {self.head_dim}"
            )

    @property
    def qk_norm(self) -> bool:
        """Qwen3 RMS-normalises each query and key head before the rotary embedding."""
        return self.arch is Arch.QWEN3

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim
