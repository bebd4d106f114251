"""What every draft head (EAGLE, EAGLE3, MTP, DFlash) holds beside its layers: its config, the target it
drafts for (embedding and lm_head, through TargetView) and its own paged KV. By default a head reads the
target's final hidden state as it is and decodes through its own `norm` and the target's lm_head."""

import torch
from torch import nn

from refengine.model.config import ModelConfig, Numerics
from refengine.model.kv_cache import KVCache
from refengine.spec_decode.target_view import TargetView


class DraftHead(nn.Module):
    capture_layers: tuple[int, ...] = ()  # the target's final hidden state

    def __init__(
        self,
        target: TargetView,
        config: ModelConfig,
        kv_cache: KVCache,
        numerics: Numerics = Numerics.BATCH_INVARIANT,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.build(config, numerics, dtype)
        self.config = config
        self.target = target
        self.kv_cache = kv_cache

    def build(self, config: ModelConfig, numerics: Numerics, dtype: torch.dtype) -> None:
        """The head's modules, in the order their weights are drawn. A head whose modules need more than
        the config builds them in its own `__init__`, after this one's."""

    def combine(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return target_hidden

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(self.norm(out)).argmax(dim=-1)

    @staticmethod
    def checkpoint_name(parameter_name: str) -> str:
        return parameter_name
