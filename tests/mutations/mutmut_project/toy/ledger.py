def release(placeholders: int, rejected: int) -> int:
    """Placeholders still outstanding after a verify step rejected `rejected` drafts."""
    remaining = placeholders - rejected
    return max(0, remaining)
