"""The known-defect catalog: one ``<id>_<name>.yaml`` record per upstream Ascend defect (README.md
says how to write one); loaded by ``npudoctor.engine.catalog.all_records``."""
