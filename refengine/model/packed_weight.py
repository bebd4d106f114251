"""A weight's copy packed once for oneDNN's matrix product: fast numerics on the CPU.

torch's `F.linear` on the CPU packs the whole weight on every call with more than one row; oneDNN packs
it once and multiplies any number of rows against it (as vLLM's CPU backend does). The copy is remade
whenever the weight changes, and runs only under `torch.inference_mode`. Design:
docs/design/architecture.md (numerics and kernels).
"""

from __future__ import annotations

import torch


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available()


class PackedWeight:
    """The packed copy of one weight, owned by the module that multiplies by it."""

    # oneDNN picks its blocking for this many rows; any number of rows can then be multiplied.
    PACK_FOR_ROWS = 16

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None  # (data_ptr, version) of the weight packed
        self._packed: torch.Tensor | None = None
        self.num_calls = 0  # products that ran on the packed copy: tests check the path ran

    def __deepcopy__(self, memo: dict) -> PackedWeight:
        # oneDNN's layout is opaque to torch and cannot be copied; a copied module packs on first use.
        return PackedWeight()

    def applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (
            x.device.type == "cpu"
            and x.dim() == 2
            and x.shape[0] > 1
            and x.dtype == weight.dtype == torch.float32
            and torch.is_inference_mode_enabled()
            and packing_available()
        )

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`x[T, K] @ weight[N, K].T` against the packed copy of `weight`."""
        # Inference tensors keep no version counter; only their storage tells them apart.
        key = (weight.data_ptr(), 0 if weight.is_inference() else weight._version)
        if key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.PACK_FOR_ROWS)
            self._key = key
        self.num_calls += 1
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
