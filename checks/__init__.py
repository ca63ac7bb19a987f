"""Checks, one module per known defect; discovered by ``npudoctor.check.all_checks``."""
