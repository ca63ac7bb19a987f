"""NPD005: every ``get_cpu_copy``/``load_cpu_copy`` override accepts and forwards the keywords its callers pass.

The SWA pool and allocator lacked ``mamba_indices`` and raised TypeError on retract
(https://github.com/sgl-project/sglang/pull/24026); the keyword set grows across releases.

The static probe arrives with the static-depth issue; until then the check is registered
with its metadata and reports ``skip``.
"""

from __future__ import annotations

from npudoctor.check import Check, Probe
from npudoctor.facts import Facts
from npudoctor.results import Status
from npudoctor.target import Target


class OffloadSignatures(Check):
    id = "NPD005"
    title = "get_cpu_copy/load_cpu_copy overrides accept the keywords their callers pass"
    upstream = ("https://github.com/sgl-project/sglang/pull/24026",)
    fixed_in = "0.5.15"
    why = "Callers pass keywords (mamba_indices=, req_pool_index=) through the allocator to the pool; an override with a narrower signature raises TypeError at the first retraction."
    bites_when = "PD decode role that retracts, with a pool or allocator whose offload override lacks a keyword the installed callers pass."
    how_to_fix = "Upgrade sglang, or apply the npudoctor runtime override for NPD005 (accept and forward the keywords)."

    def static(self, target: Target, facts: Facts) -> Probe:
        return Probe(Status.SKIP, "not implemented yet: the static probe of NPD005 is still to come")


CHECK = OffloadSignatures()
