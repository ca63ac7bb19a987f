"""The check model, the one verdict, running checks, the registry."""
