"""The target's step on device tensors: the device completion of its inputs (device_inputs.py), the
model, and the sampled rows' logits. The eager way runs it on the step's own tensors; the target's CUDA
graphs (target_graphs.py) capture the very same function on their static buffers."""

from dataclasses import dataclass

import torch

from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.kv_cache import KVCache
from refengine.model.transformer import ModelOutput, Transformer
from refengine.worker.device_inputs import CompletedInputs, DeviceInputs


@dataclass(frozen=True, slots=True)
class TargetStep:
    """The target's outputs on the device: every fed row's, the sampled rows' logits, the inputs as the
    device completed them, and the sampled rows' indices among the fed rows."""

    model_output: ModelOutput
    logits: torch.Tensor
    inputs: CompletedInputs
    logits_indices: torch.Tensor


def forward(
    model: Transformer, kv_cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
    logits_indices: torch.Tensor, inputs: DeviceInputs | None, capture_layers: tuple[int, ...],
    gathers: bool = True, shifts: bool = True,
) -> TargetStep:  # fmt: skip
    """The target's step on device tensors, completed first by `inputs` (None: nothing to complete)."""
    done = CompletedInputs(ids, positions, meta, None)
    if inputs is not None:
        done = inputs.complete(ids, positions, meta, kv_cache.block_size, gathers=gathers, shifts=shifts)
    out = model(done.ids, done.positions, done.attn_metadata, kv_cache, capture_layers=capture_layers)
    return TargetStep(out, model.compute_logits(out.hidden_states[logits_indices]), done, logits_indices)


