"""The engine: EngineCore's step loop, output processing and the offline LLM API."""
