"""The OpenAI-compatible HTTP server and the command lines that start the engine."""
