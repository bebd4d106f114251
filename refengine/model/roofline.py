"""Bytes a decode step must read, for roofline estimates in the benchmarks."""

import torch

from refengine.model.config import ModelConfig


def weight_bytes_per_step(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of weights one decode step reads: every projection, the norms and the lm_head (the
    embedding when tied); the input embedding is not counted, since only the batch's rows are read."""
    per_layer = (
        config.hidden_size * (config.q_size + 2 * config.kv_size)  # qkv_proj
        + config.q_size * config.hidden_size  # o_proj
        + config.hidden_size * 2 * config.intermediate_size  # gate_up_proj
        + config.intermediate_size * config.hidden_size  # down_proj
        + 2 * config.hidden_size  # the two layer norms
        + (2 * config.head_dim if config.qk_norm else 0)
    )
    total = config.num_hidden_layers * per_layer + config.hidden_size + config.vocab_size * config.hidden_size
    return total * dtype.itemsize


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V one cached token holds over all layers (what attention reads per key)."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype.itemsize
