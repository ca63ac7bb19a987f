"""The live depth: import the real sglang on CPU behind a small NPU simulation."""
