"""What one role's dry run saw, sent from its interpreter to the live child (pickled)."""

from __future__ import annotations

from dataclasses import dataclass, field

from npudoctor.live.locations import Raised

# The steps of a dry run, in the order the requests reach them.
START_UP = "start-up"
PREFILL = "prefill"
BATCHED_PREFILL = "prefill of several sequences"
CHUNKED_PREFILL = "chunked prefill"
PREFIX_HIT = "prefix-cache hit"
DECODE = "decode"
STEPS = (START_UP, PREFILL, BATCHED_PREFILL, CHUNKED_PREFILL, PREFIX_HIT, DECODE)


@dataclass
class Step:
    name: str
    ran: bool
    detail: str = ""  # what ran (batches, tokens) or why it did not


@dataclass
class DryRunOutcome:
    role: str
    release_entry: str = ""  # sglang's function the run started from, file:line
    steps: list[Step] = field(default_factory=list)
    # sglang raised: the step it was in and the exception (frames that are sglang's)
    failed_step: str | None = None
    failure: Raised | None = None
    # the run reached an op the simulation has no reference for, or a module this host lacks
    gap: str | None = None
    gap_step: str | None = None
    ops: dict[str, int] = field(default_factory=dict)  # simulated NPU ops called, with counts
    gaps: dict[str, int] = field(default_factory=dict)
    stood_in: dict[str, str] = field(default_factory=dict)
    adjusted: list[str] = field(default_factory=list)  # server args the dry run set, and why
    not_simulated: list[str] = field(default_factory=list)  # features of the role not run, and why
    model: list[str] = field(default_factory=list)  # the small model: what was shrunk, what kept
    # the class that served the model, and, where it is not sglang's own class of the config's
    # architecture, why sglang's own could not be imported
    served_by: str = ""
    model_import_failure: Raised | None = None
    seconds: float = 0.0
    error: str | None = None  # the dry run itself could not run (npudoctor's own failure)

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)
