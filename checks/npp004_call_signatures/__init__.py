"""NPP004: every call on the deployment's NPU path binds to the function it reaches.

sglang keeps one tree for every device, and its Ascend code is mostly overrides and twins of code
written for CUDA: NPU pools override the generic pools' methods, layers carry a ``forward_npu``
beside ``forward_native``/``forward_cuda``, NPU helpers are handed what a generic caller prepared.
When a generic caller grows a keyword, every override it reaches must grow with it, or Python
raises ``TypeError`` before the override runs a line, on Ascend only: 0.5.13's allocator always
passed ``mamba_indices=`` to its pool while the NPU pools' new overrides were written as
``get_cpu_copy(self, indices)`` (the decode server died at its first retraction; fixed by
https://github.com/sgl-project/sglang/pull/27802 and #29146), and a ``forward_npu(self, x)`` whose
``forward_native(self, x, residual=None)`` callers pass ``residual=`` crashes only on NPU. NPD005
checks the offload chain; this property is the same question over every call of the path.

Static probe (reads the source with ``ast``; sglang is never imported). Each role's NPU path
(``npudoctor.static.npupath``: the classes the role builds and the functions they run, branches
dead on Ascend left out) is read call by call (``npupath.reachable_calls``):

* **What a call reaches** (``npudoctor.static.binding.CallBinder``): ``walker.CallResolver``
  resolves names, ``self``/``super()``/``Base.m(self)``/``Class.m()`` calls through the MRO of the class built,
  imports and typed receivers; a virtual call reaches only the classes the role builds.
  ``self.<attr>(...)`` on a module the role builds runs its ``forward``; ``Class(...)`` runs the
  ``__init__`` the MRO gives. sglang's platform dispatch (``MultiPlatformOp``, ``BaseFusedOp``: a
  ``forward(self, *args, **kwargs)`` in a class with ``forward_native``) runs ``forward_npu`` on
  Ascend (its default: ``forward_native``), and pure ``*args, **kwargs`` forwarders are followed
  to the definition that receives the arguments.
* **Binding** (``signatures.bind_errors``), as CPython binds: too many positional arguments, an
  unexpected keyword, a missing required argument; ``staticmethod``/``classmethod`` and the
  explicit ``self`` of ``Base.m(self, ...)`` accounted for; ``*xs``/``**kw`` spreads get the
  benefit of the doubt, except a local tuple whose length the source gives (what a
  ``*_prepare_npu`` helper returns, spread into its ``*_core_npu`` partner).
* **Twins**: a layer the role builds whose ``forward_npu`` takes less than its
  ``forward_native``/``forward_cuda`` and whose callers the walk did not find is a ``warn``.
* **NPU overrides behind untyped receivers** (``forward_batch.token_to_kv_pool.m(...)``): where a
  class the role builds defines ``m`` as an NPU override narrower than the method it overrides, and
  the call binds to the overridden method only, ``warn``: the source does not say which it is.
* **Alternatives**: a receiver typed by an annotation or a conditional assignment may hold any of
  the classes the role builds that fit; the call is claimed only when it fails on every one (the
  allocator's ``self._kvcache`` is the NPU pool, or for hybrid and sliding-window models the
  ``HybridLinearKVPool``/``SWAKVPool`` the model runner wraps around it).
* **Nothing claimed where the source cannot settle it**: decorators that may change a signature,
  a method shadowed by an instance attribute (``self.forward = ...``), a local name holding a
  callable, a definition written once per platform whose live copies disagree, ``@overload``
  stubs, a class whose ``__init__`` an external base or a metaclass may provide.
* **What the walk over-approximates** is left out (``static._Graph``): functions named for another
  device (``DeepseekMLARocmForwardMixin``), the host copy of KV in a role that never offloads, and
  what is only called under a dispatch value NPU never has (``if m == AttnForwardMethod.MHA`` when
  the enum has the NPU variant ``MHA_NPU``: the Ascend handler returns the NPU members) or a
  speculative algorithm the role does not run (``spec_algorithm.is_dflash()``).

A call that does not bind is a ``fail`` with the caller's file:line and the callee's. Every
finding over the wheels 0.5.8 .. 0.5.23 and the example deployments is triaged in
``tests/data/properties/NPP004.yaml``.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact
from npudoctor.target.discovery import Target


class CallSignatures(Check):
    """NPP004: every call on the NPU path binds; every ``forward_npu`` takes what its twins take."""

    id = "NPP004"
    kind = CheckKind.PROPERTY  # not in the default selection: it walks the whole NPU path
    title = "Every call on the deployment's NPU path binds to the function it reaches"
    upstream = (
        "https://github.com/sgl-project/sglang/pull/27802",
        "https://github.com/sgl-project/sglang/pull/29146",
    )
    impact = Impact.RUNTIME_CRASH
    why = (
        "NPU overrides and forward_npu twins are written against callers that keep growing: an "
        "override that does not take what a caller passes raises TypeError on Ascend only, at "
        "start-up or at the first request (or retraction) that reaches it."
    )
    bites_when = (
        "A function the deployment runs on NPU calls an override, twin or helper with an argument "
        "it does not accept (or without one it requires)."
    )
    how_to_fix = (
        "upgrade to a release where the callee accepts the call, or patch the callee's signature "
        "(the evidence names the caller and callee file:line)"
    )
    runtime_fix = False

    def static(self, target: Target, facts: Facts) -> Probe:
        """Bind every call on each role's NPU path to what it reaches (``static.probe``)."""
        from .static import probe  # not loaded when the answer is cached

        return probe(target.tree, facts)


CHECK = CallSignatures()
