"""What a drafter head borrows from the target: its token embedding and its lm_head."""

from dataclasses import dataclass

import torch

from refengine.model.transformer import Transformer


@dataclass(frozen=True)
class TargetView:
    """Bound to the target's modules without registering them, so a head's `parameters()` are its own
    (the trainer optimises those and never the target's)."""

    model: Transformer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size
