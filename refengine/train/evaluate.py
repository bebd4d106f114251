"""Acceptance of a drafter on held-out prompts: offline from a distillation set, and in the engine.

Both count greedy acceptance the way the engine does: from a committed position, the drafts are
accepted up to the first that differs from the target's own greedy token. Offline, the target's
continuation is the distillation set's, and drafts come from the batched training forward with the
true tokens as inputs, which are the drafter's inputs whenever the earlier drafts were right; every
position of a continuation is an anchor. In the engine, anchors are only the positions the
speculative loop actually stops at.

Mean accepted length follows vLLM: 1 + accepted drafts per verify step (the bonus token counts).
"""

from dataclasses import dataclass

import torch

from refengine.spec_decode.dflash import DFlashNetwork
from refengine.train.batches import collate, plan_batches
from refengine.train.data import DistillSet
from refengine.train.forward import dflash_blocks, final_norm, hidden_head_pass, num_kv_layers
from refengine.train.objectives import feature_names, head_input


@dataclass(frozen=True)
class Acceptance:
    num_steps: int  # anchors (offline) or verify steps carrying drafts (engine)
    per_position: tuple[float, ...]  # [i]: share of steps whose draft i + 1 was accepted
    mean_accepted_length: float  # 1 + accepted drafts per step, at k = len(per_position)
    # Engine only: tokens generated per target step, steps without drafts included (ngram proposes
    # only where its lookup matches, so its per-step figures cover fewer steps than a head's).
    tokens_per_step: float | None = None

    def at(self, k: int) -> float:
        """Mean accepted length had only the first k drafts been proposed (offline only: in the
        engine, k changes which positions the loop stops at)."""
        return 1 + sum(self.per_position[:k])


def _greedy(head, out: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The head's full-vocabulary argmax for output rows `[N, H]`, a chunk of rows at a time."""
    normed = final_norm(head, out)
    return torch.cat([head.target.compute_logits(part).argmax(-1) for part in normed.split(chunk)])


def _accepted_lengths(correct: torch.Tensor) -> torch.Tensor:
    """correct `[N, K]` bool -> leading run of True per row."""
    return correct.long().cumprod(dim=1).sum(dim=1)


@torch.no_grad()
def offline_acceptance(head, data: DistillSet, k: int, batch_tokens: int = 2048) -> Acceptance:
    """Anchors: every position p of a continuation (x[p+1] generated) with k tokens after x[p+1]."""
    runs = []
    names = feature_names(head)
    for members in plan_batches(data, batch_tokens, max_len=10**6):
        batch = collate(data, members, names, 10**6, pad=k + 2)
        lengths, prompts = batch.lengths[:, None], batch.prompt_lens[:, None]
        device = batch.tokens.device
        if isinstance(head, DFlashNetwork):
            # Anchor L = p + 1: the block [x[L], mask x k] drafts x[L+1..L+k].
            width = batch.max_len
            anchors = torch.arange(width, device=device).expand(len(members), width)
            keep = (anchors >= prompts.clamp(min=1)) & (anchors + k <= lengths - 1)
            context = head.combine(head_input(head, batch))
            block = torch.full((*anchors.shape, k + 1), head.mask_token_id, dtype=torch.long, device=device)
            block[..., 0] = batch.tokens[:, :width]
            out = dflash_blocks(head, context, block, anchors)[keep][:, 1:]
            drafts = _greedy(head, out.reshape(-1, out.shape[-1])).reshape(out.shape[:-1])
            truth = batch.tokens[
                torch.arange(len(members), device=device)[:, None, None],
                anchors[..., None] + torch.arange(1, k + 1, device=device),
            ]
            runs.append(drafts == truth[keep])
            continue
        rows = batch.max_len - 1
        p = torch.arange(rows, device=device)
        keep = (p[None] + 1 >= prompts) & (p[None] + k + 1 <= lengths - 1)
        kv = [[] for _ in range(num_kv_layers(head))]
        hidden = head.combine(head_input(head, batch))[:, :rows]
        correct = []
        for s in range(1, k + 1):
            positions = (p + s - 1).expand(len(members), rows)
            hidden = hidden_head_pass(head, batch.tokens[:, s : s + rows], hidden, positions, kv)
            drafts = _greedy(head, hidden[keep])
            correct.append(drafts == batch.tokens[:, s + 1 : s + 1 + rows][keep])
        runs.append(torch.stack(correct, dim=1))
    correct = torch.cat(runs)
    accepted = _accepted_lengths(correct)
    per_position = tuple(float((accepted > i).float().mean()) for i in range(k))
    return Acceptance(len(correct), per_position, 1 + float(accepted.float().mean()))


def engine_acceptance(llm, prompts, params) -> Acceptance:
    """Run `prompts` through an LLM built with a speculative config; its scheduler's counters."""
    scheduler = llm.engine.core.scheduler
    before = scheduler.spec_decoding_stats
    num_drafts0, accepted0 = before.num_drafts, before.num_accepted_tokens
    per_pos0 = list(before.num_accepted_tokens_per_pos)
    outputs = llm.generate(prompts, params)
    stats = scheduler.spec_decoding_stats
    steps = stats.num_drafts - num_drafts0
    per_pos = [
        n - (per_pos0[i] if i < len(per_pos0) else 0) for i, n in enumerate(stats.num_accepted_tokens_per_pos)
    ]
    k = llm.engine.config.speculative_config.num_speculative_tokens
    per_pos += [0] * (k - len(per_pos))
    accepted = stats.num_accepted_tokens - accepted0
    generated = sum(len(o.token_ids) for o in outputs)
    return Acceptance(
        steps,
        tuple(n / max(steps, 1) for n in per_pos[:k]),
        1 + accepted / max(steps, 1),
        generated / max(generated - accepted, 1),
    )
