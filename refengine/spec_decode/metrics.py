"""SpecDecodingStats (vLLM's spec_decode/metrics.py): how many drafts were verified and how many of their
tokens were accepted. Torch-free: each Request and the scheduler count into one, and the engine reports it."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodingStats:
    num_drafts: int = 0  # verify steps that carried at least one real draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [i] = how many drafts had their token at position i accepted.
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # [i] = how many drafts had a token at position i: the denominator of position i's acceptance
    # when drafts differ in length (adaptive verification, budget cuts).
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        if not 0 <= num_accepted_tokens <= num_draft_tokens:
            raise ValueError(f"accepted {num_accepted_tokens} of {num_draft_tokens} draft tokens")
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for per_pos, num in ((self.num_accepted_tokens_per_pos, num_accepted_tokens),
                             (self.num_draft_tokens_per_pos, num_draft_tokens)):
            per_pos.extend([0] * (num_draft_tokens - len(per_pos)))
            for pos in range(num):
                per_pos[pos] += 1

    def copy(self) -> "SpecDecodingStats":
        return SpecDecodingStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                 list(self.num_accepted_tokens_per_pos), list(self.num_draft_tokens_per_pos))
