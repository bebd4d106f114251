"""Speculative decoding: configuration, drafters and the async-scheduling truth table."""
