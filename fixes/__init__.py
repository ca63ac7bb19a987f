"""Runtime overrides, one module per check id (same id as the check they fix)."""
