"""Acceptance of a drafter on held-out prompts: offline from a distillation set, and in the engine.

Both count greedy acceptance as the engine does, and offline counts only the positions the engine's
speculative loop would stop at (counting every position overstated eagle3's mean accepted length at
k = 4 by about half a token). Mean accepted length follows vLLM: 1 + accepted drafts per verify step.
Design: docs/design/spec-decode.md (the shipped heads and their training).
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
    num_steps: int  # verify steps carrying drafts (offline: the steps the engine's loop would take)
    per_position: tuple[float, ...]  # [i]: share of steps whose draft i + 1 was accepted
    mean_accepted_length: float  # 1 + accepted drafts per step, at k = len(per_position)
    # Engine only: tokens generated per target step, steps without drafts included (ngram proposes
    # only where its lookup matches, so its per-step figures cover fewer steps than a head's).
    tokens_per_step: float | None = None

    @classmethod
    def of(cls, accepted: list[int], k: int) -> "Acceptance":
        """From the accepted drafts of each verify step."""
        steps = max(len(accepted), 1)
        per_position = tuple(sum(a > i for a in accepted) / steps for i in range(k))
        return cls(len(accepted), per_position, 1 + sum(accepted) / steps)


def _greedy(head, out: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The head's full-vocabulary argmax for output rows `[N, H]`, a chunk of rows at a time."""
    normed = final_norm(head, out)
    return torch.cat([head.target.compute_logits(part).argmax(-1) for part in normed.split(chunk)])


def _accepted_lengths(correct: torch.Tensor) -> torch.Tensor:
    """correct `[..., K]` bool -> leading run of True."""
    return correct.long().cumprod(dim=-1).sum(dim=-1)


def _dflash_runs(head: DFlashNetwork, batch, k: int) -> torch.Tensor:
    """Accepted drafts `[B, W]` of the block at every anchor L (x[L] the last sampled token): the
    block [x[L], mask x k] drafts x[L+1..L+k]."""
    device = batch.tokens.device
    width = batch.max_len
    anchors = torch.arange(width, device=device).expand(len(batch.lengths), width)
    context = head.combine(head_input(head, batch))
    block = torch.full((*anchors.shape, k + 1), head.mask_token_id, dtype=torch.long, device=device)
    block[..., 0] = batch.tokens[:, :width]
    out = dflash_blocks(head, context, block, anchors)[..., 1:, :]
    drafts = _greedy(head, out.reshape(-1, out.shape[-1])).reshape(out.shape[:-1])
    truth = batch.tokens[
        torch.arange(len(batch.lengths), device=device)[:, None, None],
        anchors[..., None] + torch.arange(1, k + 1, device=device),
    ]
    return _accepted_lengths(drafts == truth)


def _hidden_runs(head, batch, k: int) -> torch.Tensor:
    """Accepted drafts `[B, W]` at every anchor L = p + 1: pass 1 at row p reads x[L] and the target
    features at p; pass s drafts x[L + s]."""
    rows = batch.max_len - 1
    device = batch.tokens.device
    p = torch.arange(rows, device=device)
    kv = [[] for _ in range(num_kv_layers(head))]
    hidden = head.combine(head_input(head, batch))[:, :rows]
    correct = []
    for s in range(1, k + 1):
        positions = (p + s - 1).expand(len(batch.lengths), rows)
        hidden = hidden_head_pass(head, batch.tokens[:, s : s + rows], hidden, positions, kv)
        drafts = _greedy(head, hidden.reshape(-1, hidden.shape[-1])).reshape(hidden.shape[:-1])
        correct.append(drafts == batch.tokens[:, s + 1 : s + 1 + rows])
    runs = _accepted_lengths(torch.stack(correct, dim=-1))
    # Row p's run belongs to anchor p + 1; anchor 0 has none (a sequence starts with a prompt).
    return torch.cat([runs.new_zeros(len(batch.lengths), 1), runs], dim=1)


def loop_steps(runs: list[int], first: int, last: int) -> list[int]:
    """The accepted drafts of the steps the engine's loop takes over anchors first..last, where
    runs[L] is the accepted drafts at anchor L: each step moves on by its accepted drafts and the
    bonus token."""
    steps, anchor = [], first
    while anchor <= last:
        steps.append(runs[anchor])
        anchor += runs[anchor] + 1
    return steps


@torch.no_grad()
def offline_acceptance(head, data: DistillSet, k: int, batch_tokens: int = 2048) -> Acceptance:
    """Steps from the first sampled token x[P] (P the prompt length) while k tokens follow the anchor."""
    steps = []
    names = feature_names(head)
    for members in plan_batches(data, batch_tokens, max_len=10**6):
        batch = collate(data, members, names, 10**6, pad=k + 2)
        runs = _dflash_runs(head, batch, k) if isinstance(head, DFlashNetwork) else _hidden_runs(head, batch, k)
        bounds = zip(batch.lengths.tolist(), batch.prompt_lens.tolist(), strict=True)
        for b, (length, prompt) in enumerate(bounds):
            steps += loop_steps(runs[b].tolist(), max(prompt, 1), length - 1 - k)
    return Acceptance.of(steps, k)


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
