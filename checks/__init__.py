"""Checks, one module per known defect; discovered by ``npudoctor.engine.check.all_checks``."""
