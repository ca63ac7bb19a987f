"""NPD007, the dry run: the deployment's real sglang start-up and serving path on a small model."""
