"""The OpenAI-compatible HTTP endpoint: (chat) completions over the engine, and the external agents' routes."""
