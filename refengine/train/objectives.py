"""Per-method losses, in the spirit of each method's published recipe, and the held-out acceptance
they are judged by.

Token targets are the target's own next-token distribution over a shortlist of frequent tokens, as EAGLE
distils it. eagle adds feature regression, eagle3 a light feature term, mtp predicts next-k at every
depth, dflash predicts blocks from context features with position weights decaying along the block.
Design: docs/design/spec-decode.md (the shipped heads and their training).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from refengine.spec_decode.dflash import DFlashNetwork
from refengine.train.batches import Batch
from refengine.train.data import FINAL, layer_key
from refengine.train.draft_vocab import most_frequent
from refengine.train.forward import HiddenHead, dflash_blocks, final_norm, hidden_head_pass, num_kv_layers


@dataclass(frozen=True)
class Shortlist:
    """The vocabulary the losses score: the distillation set's most frequent tokens."""

    weight: torch.Tensor  # [V', H] the target's lm_head rows of these tokens
    member: torch.Tensor  # [vocab] bool

    @classmethod
    def of(cls, tokens: torch.Tensor, lm_head: torch.Tensor, size: int) -> "Shortlist":
        ids = most_frequent(torch.bincount(tokens.to(lm_head.device), minlength=lm_head.shape[0]), size)
        member = torch.zeros(lm_head.shape[0], dtype=torch.bool, device=lm_head.device)
        member[ids] = True
        return cls(lm_head[ids].detach(), member)

    def coverage(self, tokens: torch.Tensor) -> float:
        return float(self.member[tokens].float().mean())


@dataclass(frozen=True)
class Recipe:
    passes: int  # hidden heads: unrolled passes; dflash: drafts per block (block = passes + 1)
    feature_weight: float
    token_weight: float
    decay: float  # weight of pass (or block position) s is decay ** (s - 1)


RECIPES = {
    "eagle": Recipe(passes=3, feature_weight=1.0, token_weight=1.0, decay=0.8),
    "eagle3": Recipe(passes=3, feature_weight=0.1, token_weight=1.0, decay=0.8),
    "mtp": Recipe(passes=3, feature_weight=0.0, token_weight=1.0, decay=0.8),
    "dflash": Recipe(passes=8, feature_weight=0.0, token_weight=1.0, decay=0.8),
}


def feature_names(head) -> list[str]:
    """The distillation-set features a head reads (in its concatenation order) plus FINAL."""
    layers = list(head.capture_layers)
    return [layer_key(i) for i in layers] + ([FINAL] if FINAL not in [layer_key(i) for i in layers] else [])


def head_input(head, batch: Batch) -> torch.Tensor:
    layers = head.capture_layers
    if not layers:
        return batch.features[FINAL]
    return torch.cat([batch.features[layer_key(i)] for i in layers], dim=-1)


def _soft_ce(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid rows of cross-entropy(softmax(teacher), student)."""
    loss = -(F.softmax(teacher, dim=-1) * F.log_softmax(student, dim=-1)).sum(-1)
    return (loss * valid).sum() / valid.sum().clamp(min=1)


def _shift(t: torch.Tensor, s: int, rows: int) -> torch.Tensor:
    """Rows s..s+rows-1 of dim 1, zero-padded past the end."""
    out = t.new_zeros(t.shape[0], rows, *t.shape[2:])
    part = t[:, s : s + rows]
    out[:, : part.shape[1]] = part
    return out


def hidden_head_loss(
    head: HiddenHead, batch: Batch, recipe: Recipe, shortlist: Shortlist
) -> tuple[torch.Tensor, dict[str, float]]:
    rows = batch.max_len - 1
    p = torch.arange(rows, device=batch.tokens.device)
    positions = p.expand(len(batch.lengths), rows)
    target_final = batch.features[FINAL]
    combined = head.combine(head_input(head, batch))
    kv = [[] for _ in range(num_kv_layers(head))]
    hidden = combined[:, :rows]
    total, weights, metrics = 0.0, 0.0, {}
    for s in range(1, recipe.passes + 1):
        ids = batch.tokens[:, s : s + rows]
        hidden = hidden_head_pass(head, ids, hidden, positions + s - 1, kv)
        # Row p's pass-s output drafts the token the target predicts from position p + s, x[p+s+1].
        # Only drafts of reply tokens are scored (the prompt is context, never drafted in serving),
        # nor those whose token is off the shortlist.
        following = shortlist.member[batch.tokens[:, s + 1 : s + 1 + rows]]
        in_reply = p[None, :] + s + 1 >= batch.prompt_lens[:, None]
        valid = ((p[None, :] + s <= batch.lengths[:, None] - 2) & following & in_reply).float()
        stands_for = _shift(target_final, s, rows)
        with torch.no_grad():
            teacher = F.linear(stands_for, shortlist.weight)
        student = F.linear(final_norm(head, hidden), shortlist.weight)
        loss = recipe.token_weight * _soft_ce(student, teacher, valid)
        if recipe.feature_weight:
            # EAGLE's hidden stands in for the target's final hidden; EAGLE3's for the combined features.
            goal = stands_for if head.capture_layers == () else _shift(combined, s, rows).detach()
            regress = F.smooth_l1_loss(hidden, goal, reduction="none").mean(-1)
            loss = loss + recipe.feature_weight * (regress * valid).sum() / valid.sum().clamp(min=1)
        weight = recipe.decay ** (s - 1)
        total, weights = total + weight * loss, weights + weight
        agree = (student.argmax(-1) == teacher.argmax(-1)).float()
        metrics[f"acc{s}"] = float((agree * valid).sum() / valid.sum().clamp(min=1))
    loss = total / weights
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def choose_anchors(batch: Batch, num_anchors: int, width: int, generator: torch.Generator) -> tuple:
    """Per sequence, up to num_anchors distinct anchors L in its continuation (L >= prompt length,
    with a label after it); returns anchors [B, N] and a mask of the real ones."""
    anchors = torch.zeros(len(batch.lengths), num_anchors, dtype=torch.long)
    real = torch.zeros(len(batch.lengths), num_anchors, dtype=torch.bool)
    for b, (length, prompt) in enumerate(
        zip(batch.lengths.tolist(), batch.prompt_lens.tolist(), strict=True)
    ):
        low, high = max(prompt, 1), length - 2  # inclusive
        if high < low:
            continue
        pick = low + torch.randperm(high - low + 1, generator=generator)[:num_anchors]
        anchors[b, : len(pick)], real[b, : len(pick)] = pick, True
    return anchors.to(batch.tokens.device), real.to(batch.tokens.device)


def dflash_loss(
    head: DFlashNetwork,
    batch: Batch,
    recipe: Recipe,
    shortlist: Shortlist,
    anchors: torch.Tensor,
    real: torch.Tensor,
    num_drafts: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    context = head.combine(head_input(head, batch))
    device = batch.tokens.device
    rows = torch.arange(len(batch.lengths), device=device)[:, None, None]
    offsets = torch.arange(num_drafts + 1, device=device)
    block_ids = torch.full((*anchors.shape, num_drafts + 1), head.mask_token_id, dtype=torch.long, device=device)
    block_ids[..., 0] = batch.tokens[rows[..., 0], anchors]
    out = dflash_blocks(head, context, block_ids, anchors)[..., 1:, :]  # rows 1..K draft x[L+1..L+K]
    # Block row i is judged against the target's prediction from position L + i - 1.
    source = (anchors[..., None] + offsets[:-1]).clamp(max=batch.max_len - 1)
    drafted = (anchors[..., None] + offsets[1:]).clamp(max=batch.tokens.shape[1] - 1)
    valid = (
        real[..., None]
        & (anchors[..., None] + offsets[1:] <= batch.lengths[:, None, None] - 1)
        & shortlist.member[batch.tokens[rows, drafted]]
    )
    with torch.no_grad():
        teacher = F.linear(batch.features[FINAL][rows, source], shortlist.weight)
    student = F.linear(final_norm(head, out), shortlist.weight)
    loss = -(F.softmax(teacher, dim=-1) * F.log_softmax(student, dim=-1)).sum(-1)
    weights = recipe.decay ** offsets[:-1].float() * valid
    total = (loss * weights).sum() / weights.sum().clamp(min=1e-9)
    agree = (student.argmax(-1) == teacher.argmax(-1)) & valid
    metrics = {"loss": float(total.detach())}
    for i in (0, 1, num_drafts - 1):
        metrics[f"acc{i + 1}"] = float(agree[..., i].sum() / valid[..., i].sum().clamp(min=1))
    return total, metrics
