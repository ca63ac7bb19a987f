"""Checks, one module per known defect; discovered by ``npudoctor.engine.registry.all_checks``."""
