"""ladder: a concurrency ladder against any OpenAI-compatible endpoint."""
