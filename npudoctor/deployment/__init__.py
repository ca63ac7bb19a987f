"""The deployment: parsing, facts, launch command, server arguments."""
