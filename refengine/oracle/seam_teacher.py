"""Seam teachers: stand-ins for a drafter's network that propose the target's own greedy continuation,
so the acceptance oracle (invariant 27) can demand exactly 100% acceptance while each method's real
drafter loop runs. A teacher proposes only if everything it reads back through the paged layout is
bitwise what the target produced; a seam fed a wrong row, position or slot proposes garbage, which
shows as lost acceptance. CorruptingProposer breaks chosen draft indices, so acceptance is scripted.

Design: docs/design/oracle.md. Invariant numbers refer to docs/invariants.md.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from refengine.engine.llm import LLM
from refengine.model.attention_metadata import AttentionMetadata
from refengine.model.attention_metadata_builder import build_attention_metadata
from refengine.model.kv_cache import KVCache
from refengine.model.loader import LoadedModel
from refengine.spec_decode.dflash import DFlashProposer, build_target_layer_ids
from refengine.spec_decode.draft_model import DraftModelProposer
from refengine.spec_decode.eagle import default_eagle3_aux_layer_ids, eagle3_capture_layers
from refengine.spec_decode.hidden_state_proposer import HiddenStateProposer
from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch, Proposer

GARBAGE_TOKEN = 0  # what a teacher proposes when its inputs do not match any trajectory
DFLASH_MASK_TOKEN = 5  # any id works for the teacher: it only checks the block carries it


@dataclass(frozen=True)
class Trajectory:
    """A prompt and the target's greedy continuation, with the target's rows at every position."""

    tokens: list[int]
    hidden: torch.Tensor  # [N, H] final hidden state (after the final norm)
    aux: dict[int, torch.Tensor]  # layer i's output, [N, H]

    def features(self, layers: Sequence[int]) -> torch.Tensor:
        """What a method reads from the target: the final hidden, or chosen layer outputs concatenated."""
        return torch.cat([self.aux[i] for i in layers], dim=-1) if layers else self.hidden


class Trajectories:
    """The target's greedy trajectories of the registered prompts, `length` tokens each."""

    def __init__(self, target: LoadedModel, prompts: Iterable[Sequence[int]], extra_tokens: int) -> None:
        self.target = target
        self.items = [self._trajectory(list(p), len(p) + extra_tokens) for p in prompts]

    def _trajectory(self, prompt: list[int], length: int) -> Trajectory:
        model = self.target.model
        num_layers = len(model.layers)
        block_size = 16  # the scratch cache's own layout, unrelated to the engine's
        num_blocks = -(-length // block_size)
        cache = KVCache.allocate(self.target.config, num_blocks, block_size)
        blocks = [list(range(num_blocks))]
        tokens = list(prompt)
        with torch.inference_mode():
            # Greedy decoding, one position at a time after the prompt. The model is batch invariant, so
            # these rows equal the engine's whatever its chunking and batch.
            fed = 0
            while len(tokens) < length:
                ids = tokens[fed:]
                meta = build_attention_metadata([fed], [len(ids)], blocks, block_size)
                out = model(torch.tensor(ids), torch.arange(fed, fed + len(ids)), meta, cache)
                tokens.append(int(model.compute_logits(out.hidden_states[-1:]).argmax(-1)))
                fed = len(tokens) - 1
            # One pass over the whole trajectory for its rows at every position.
            meta = build_attention_metadata([0], [length], blocks, block_size)
            out = model(
                torch.tensor(tokens),
                torch.arange(length),
                meta,
                cache,
                capture_layers=tuple(range(num_layers)),
            )
        return Trajectory(
            tokens, out.hidden_states.clone(), {i: t.clone() for i, t in out.aux_hidden_states.items()}
        )


class SlotStore:
    """Rows kept at paged-KV slots, read back in position order through a block table, as attention
    reads its keys. Unwritten slots hold NaN, which never equals a target row."""

    def __init__(self, num_slots: int, width: int, block_size: int) -> None:
        self.rows = torch.full((num_slots, width), float("nan"))
        self.block_size = block_size

    def write(self, slot_mapping: torch.Tensor, rows: torch.Tensor) -> None:
        keep = slot_mapping >= 0
        self.rows[slot_mapping[keep]] = rows[keep].float()

    def read(self, meta: AttentionMetadata, seq: int, length: int) -> torch.Tensor:
        """Rows at positions 0..length-1 of sequence `seq`."""
        positions = torch.arange(length)
        slots = (
            meta.block_tables[seq][positions // self.block_size] * self.block_size
            + positions % self.block_size
        )
        return self.rows[slots]


def _sequences(meta: AttentionMetadata, positions: torch.Tensor):
    """(seq, first row, end row, seq_len, whether the rows sit at the seq's last positions)."""
    starts = meta.query_start_loc.tolist()
    for seq, seq_len in enumerate(meta.seq_lens.tolist()):
        begin, end = starts[seq], starts[seq + 1]
        expected = torch.arange(seq_len - (end - begin), seq_len)
        yield seq, begin, end, seq_len, torch.equal(positions[begin:end], expected)


class TeacherTokenNetwork:
    """draft_model's seam: token ids at positions. Stores token ids at slots; the output row of a
    token at position p is the target's greedy token at p + 1 given the tokens read back."""

    def __init__(self, trajectories: Trajectories, num_slots: int, block_size: int) -> None:
        self.trajectories = trajectories
        self.store = SlotStore(num_slots, 1, block_size)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        self.store.write(meta.slot_mapping, input_ids[:, None])
        out = torch.full((len(input_ids),), GARBAGE_TOKEN)
        for seq, begin, end, seq_len, aligned in _sequences(meta, positions):
            seen = self.store.read(meta, seq, seq_len)[:, 0]
            if not aligned or seen.isnan().any():
                continue
            tokens = seen.long().tolist()
            traj = next((t for t in self.trajectories.items if t.tokens[:seq_len] == tokens), None)
            if traj is None:
                continue
            for row in range(begin, end):
                nxt = int(positions[row]) + 1
                if nxt < len(traj.tokens):
                    out[row] = traj.tokens[nxt]
        return out

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        return out


class TeacherHiddenNetwork:
    """EAGLE/EAGLE3/MTP's seam: at position p, token p + 1 and a hidden row. Pass 1's rows are the
    target's (final hidden for eagle/mtp, capture_layers' outputs for eagle3); later passes feed back
    this network's own output row. Its output at position p is the target's row at p + 1 (what a perfect
    head would predict), and greedy_tokens maps that row to the target's greedy token after it."""

    def __init__(
        self,
        trajectories: Trajectories,
        num_slots: int,
        block_size: int,
        capture_layers: tuple[int, ...] = (),
    ) -> None:
        self.trajectories = trajectories
        self.capture_layers = capture_layers
        self.features = [t.features(capture_layers) for t in trajectories.items]
        width = self.features[0].shape[1]
        self.tokens = SlotStore(num_slots, 1, block_size)
        self.rows = SlotStore(num_slots, width, block_size)
        # A target row at position q (of one trajectory) -> the token at q + 1: the target's lm_head.
        self.next_token = {
            feats[q].numpy().tobytes(): traj.tokens[q + 1]
            for traj, feats in zip(trajectories.items, self.features, strict=True)
            for q in range(len(traj.tokens) - 1)
        }

    def combine(self, target_hidden: torch.Tensor) -> torch.Tensor:
        return target_hidden

    def forward(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        self.tokens.write(meta.slot_mapping, input_ids[:, None])
        self.rows.write(meta.slot_mapping, hidden)
        out = torch.zeros(len(input_ids), self.rows.rows.shape[1])
        for seq, begin, end, seq_len, aligned in _sequences(meta, positions):
            if not aligned:
                continue
            seen_tokens = self.tokens.read(meta, seq, seq_len)[:, 0]
            seen_rows = self.rows.read(meta, seq, seq_len)
            for row in range(begin, end):
                # Causal, as attention is: the row at position p reads positions 0..p only, so rows a
                # padded pass feeds past the committed ones (rejected drafts) leave earlier rows alone.
                length = int(positions[row]) + 1
                if seen_tokens[:length].isnan().any():
                    continue
                tokens = seen_tokens[:length].long().tolist()
                for traj, feats in zip(self.trajectories.items, self.features, strict=True):
                    # Row q holds token q + 1 and the target's row at q.
                    if traj.tokens[1 : length + 1] == tokens and torch.equal(feats[:length], seen_rows[:length]):
                        if length < len(feats):
                            out[row] = feats[length]
                        break
        return out

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self.next_token.get(row.numpy().tobytes(), GARBAGE_TOKEN) for row in out])


class TeacherBlockNetwork:
    """DFlash's seam: context rows (the capture layers' outputs) at their positions, then a block
    [t, mask x n] at the positions right after the context, attending non-causally. Proposes the
    target's greedy tokens after t for block rows 1..n."""

    def __init__(
        self,
        trajectories: Trajectories,
        num_slots: int,
        block_size: int,
        capture_layers: tuple[int, ...],
        mask_token_id: int,
    ) -> None:
        self.trajectories = trajectories
        self.capture_layers = capture_layers
        self.mask_token_id = mask_token_id
        self.features = [t.features(capture_layers) for t in trajectories.items]
        self.context = SlotStore(num_slots, self.features[0].shape[1], block_size)

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def store_context(self, context: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        for _, begin, end, _, aligned in _sequences(meta, positions):
            rows = context[begin:end] if aligned else torch.full_like(context[begin:end], float("nan"))
            self.context.write(meta.slot_mapping[begin:end], rows)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        out = torch.full((len(input_ids),), GARBAGE_TOKEN)
        if meta.causal:
            return out  # a causal block would not see its later rows: not what DFlash runs
        for seq, begin, end, seq_len, aligned in _sequences(meta, positions):
            ctx_len = seq_len - (end - begin)
            block = input_ids[begin:end].tolist()
            if not aligned or any(t != self.mask_token_id for t in block[1:]):
                continue
            seen = self.context.read(meta, seq, ctx_len)
            for traj, feats in zip(self.trajectories.items, self.features, strict=True):
                if (
                    len(traj.tokens) > seq_len
                    and traj.tokens[ctx_len] == block[0]
                    and torch.equal(feats[:ctx_len], seen)
                ):
                    out[begin:end] = torch.tensor(traj.tokens[ctx_len:seq_len])
                    break
        return out

    def greedy_tokens(self, out: torch.Tensor) -> torch.Tensor:
        return out


class CorruptingProposer:
    """Proposes the inner drafter's drafts with the ones at `indices` replaced by a different token,
    so a request accepts exactly min(indices) drafts per step (when the inner drafts are right)."""

    def __init__(self, inner: Proposer, indices: Iterable[int], vocab_size: int) -> None:
        self.inner = inner
        self.indices = sorted(indices)
        self.vocab_size = vocab_size
        self.random_init = False

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.inner.capture_layers

    def propose(self, batch: PaddedDraftBatch) -> torch.Tensor | None:
        """A device drafter's drafts are corrupted on the device, where the next step reads them."""
        drafts = self.inner.propose(batch)
        if drafts is None or not self.corrupts_this_step():
            return drafts
        corrupted = drafts.clone()
        for j in self.indices:
            if j < drafts.shape[1]:
                column = drafts[:, j]
                corrupted[:, j] = torch.where(column >= 0, (column + 1) % self.vocab_size, column)
        return corrupted

    def commit(self, requests: Sequence[DraftInput], drafts: list[list[int]] | None) -> dict[str, list[int]]:
        """A host drafter's drafts reach the host only here: corrupt them here."""
        proposals = self.inner.commit(requests, drafts)
        return proposals if drafts is not None or not self.corrupts_this_step() else self._corrupt(proposals)

    def corrupts_this_step(self) -> bool:
        """Asked once per step that drafts: whether its drafts are corrupted (every step here)."""
        return True

    def _corrupt(self, drafts: dict[str, list[int]]) -> dict[str, list[int]]:
        for tokens in drafts.values():
            for j in self.indices:
                if j < len(tokens):
                    tokens[j] = (tokens[j] + 1) % self.vocab_size
        return drafts

    def remove(self, req_ids: Iterable[str]) -> None:
        self.inner.remove(req_ids)


def teacher_drafter(method: str, llm: LLM, trajectories: Trajectories) -> Proposer:
    """The method's real drafter loop (state, rows, positions, slots) around a teacher network, for the
    engine `llm` was built with (its speculative config fixes k and the KV lookahead)."""
    config = llm.engine.config
    spec = config.speculative_config
    k, block_size = spec.num_speculative_tokens, config.block_size
    num_slots = config.num_blocks * block_size
    num_layers = trajectories.target.config.num_hidden_layers
    max_positions = trajectories.target.config.max_position_embeddings
    if method == "draft_model":
        return DraftModelProposer(
            TeacherTokenNetwork(trajectories, num_slots, block_size), k, block_size, max_positions
        )
    if method == "dflash":
        layers = build_target_layer_ids(num_layers, 1)
        network = TeacherBlockNetwork(trajectories, num_slots, block_size, layers, DFLASH_MASK_TOKEN)
        return DFlashProposer(network, k, block_size, max_positions, random_init=False)
    capture = (
        eagle3_capture_layers(default_eagle3_aux_layer_ids(num_layers), num_layers)
        if method == "eagle3"
        else ()
    )
    network = TeacherHiddenNetwork(trajectories, num_slots, block_size, capture)
    return HiddenStateProposer(network, method, k, block_size, max_positions, random_init=False)
