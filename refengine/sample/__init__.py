"""Sampling and speculative verification. Every random draw is keyed by (request key, absolute position)."""
