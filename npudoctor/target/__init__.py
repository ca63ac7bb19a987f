"""The sglang under test: discovery, releases, caches, history, host."""
