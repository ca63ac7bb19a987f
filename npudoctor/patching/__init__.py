"""Runtime fixes: the fix base, deciding, recording, activation, bootstrap."""
