"""The static toolkit: reading an sglang tree with ast, never importing it."""
