"""The token-identity oracle: every scheduling front and drafter must emit the baseline's tokens."""
