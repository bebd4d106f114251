"""Prompt-lookup drafting on the host: find the latest earlier occurrence of the sequence's suffix
and propose the tokens that followed it. Drafts may be shorter than k, or empty."""

from collections.abc import Iterable, Sequence

from refengine.spec_decode.proposer import DraftInput, PaddedDraftBatch


def propose_ngram(token_ids: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Longest suffix n-gram (max_n down to min_n) that occurred before; its continuation, up to k."""
    num = len(token_ids)
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        suffix = list(token_ids[num - n :])
        # Scan right to left so the most recent match wins; the match must end before the suffix.
        for start in range(num - n - 1, -1, -1):
            if list(token_ids[start : start + n]) == suffix:
                follow = start + n
                return [int(t) for t in token_ids[follow : follow + k]]
    return []


class NgramProposer:
    """Host-side prompt lookup over the runner's committed tokens. It reads committed token lists,
    which is why it forces synchronous scheduling (see ASYNC_SCHEDULING_COMPATIBLE)."""

    capture_layers: tuple[int, ...] = ()
    random_init = False
    device_drafter = None  # it drafts on the host
    modules = ()

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, batch: PaddedDraftBatch) -> None:
        """Nothing on the device: the lookup needs the committed tokens (commit)."""

    def commit(self, requests: Sequence[DraftInput], drafts: None) -> dict[str, list[int]]:
        return {d.req_id: propose_ngram(d.token_ids, self.k, self.min_n, self.max_n) for d in requests if d.propose}

    def remove(self, req_ids: Iterable[str]) -> None:
        """Stateless: everything it needs is in the committed token list."""
