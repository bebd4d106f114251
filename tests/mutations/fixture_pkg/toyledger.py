"""A toy placeholder ledger: the target that the named-mutation runner's own tests mutate."""

FIFO = True


def release(placeholders: int, rejected: int) -> int:
    """Placeholders still outstanding after a verify step rejected `rejected` drafts."""
    remaining = placeholders - rejected
    return max(0, remaining)


def next_request(queue: list[str]) -> str:
    """Requests leave the queue in arrival order."""
    return queue.pop(0)
