"""The teacher: a drafter that proposes what its arm's baseline emitted, so the oracle can demand exact
acceptance under every front and variant without waiting for trained heads.

Its arm's baseline ran first (same temperature, same bad_words), and every arm must emit the baseline's
tokens; so after any committed context the right drafts are known: the baseline's next tokens. The
teacher proposes them, with the draft at `corrupt_index` (if any) replaced by another token, so every
verification accepts exactly the drafts before the corrupted one (and before any -1 pad). A seam that
feeds the drafter a wrong context, or a verifier that rejects a right draft, shows up as acceptance off
the script.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch

TEACHER = "teacher"
CORRUPTED_TEACHER = "teacher-corrupt"
TEACHER_METHODS = (TEACHER, CORRUPTED_TEACHER)
CORRUPT_INDEX = 1  # the corrupted teacher's scripted acceptance: one draft per full verification
# The engine config a teacher arm is built with: an async-capable method, whose drafter is then replaced.
HOST_METHOD = "eagle"


@dataclass
class TeacherProposer:
    """`sequences`: each request's prompt followed by its baseline output."""

    sequences: Sequence[Sequence[int]]
    num_speculative_tokens: int
    vocab_size: int
    corrupt_index: int | None = None
    capture_layers: tuple[int, ...] = ()
    random_init: bool = False

    def propose(self, batch: PaddedDraftBatch) -> None:
        """Nothing on the device: the teacher reads the committed context (commit)."""

    def commit(self, requests: Sequence[DraftInput], drafts: None) -> dict[str, list[int]]:
        proposals = {}
        for request in requests:
            if not request.propose:
                continue
            context = [int(t) for t in request.token_ids]
            n = len(context)
            # Its own baseline first (the engine numbers requests in prompt order): a repeated prompt's
            # requests share a context but not always an output.
            own = int(request.req_id) if request.req_id.isdigit() and int(request.req_id) < len(self.sequences) else None
            candidates = ([] if own is None else [self.sequences[own]]) + list(self.sequences)
            sequence = next((s for s in candidates if list(s[:n]) == context), None)
            if sequence is None:
                continue  # a context no baseline went through: nothing to teach
            drafts = list(sequence[n : n + self.num_speculative_tokens])
            if self.corrupt_index is not None and self.corrupt_index < len(drafts):
                drafts[self.corrupt_index] = (drafts[self.corrupt_index] + 1) % self.vocab_size
            proposals[request.req_id] = drafts
        return proposals

    def remove(self, req_ids: Iterable[str]) -> None:
        """Stateless: every proposal is read off the committed context."""


def scripted_accepted(draft_token_ids: Sequence[int], corrupt_index: int | None) -> int:
    """What one verification must accept: the drafts before the first -1 pad (a placeholder left
    unfilled) and before the corrupted index."""
    first_pad = next((j for j, t in enumerate(draft_token_ids) if t < 0), len(draft_token_ids))
    return first_pad if corrupt_index is None else min(first_pad, corrupt_index)
