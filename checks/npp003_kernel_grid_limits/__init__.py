"""NPP003: every Triton kernel the deployment launches on NPU keeps its grid within Ascend's 65535.

triton-ascend maps a Triton grid onto the NPU's AI cores and refuses a launch whose grid has more
than 65535 programs in all (the product of its dimensions is the kernel's ``coreDim``, a 16-bit
field: "coreDim=123408 can't be greater than UINT16_MAX", sglang issue #10554). sglang's own
Triton kernels are written for CUDA, where a grid dimension may reach 2^31 - 1, and many of them
launch one program per token (times heads): on NPU they run until a forward carries enough tokens,
then the scheduler dies at the first long prefill. Upstream met it kernel by kernel: Qwen3.5's
``fused_qkvzba_split_reshape_cat_contiguous`` (PR #23815), Qwen3-Next's
``fused_qkvzba_split_reshape_cat`` and ``fused_gdn_gating`` (PR #19756), Qwen2-MoE's fused gate
and Qwen3.5's ``fused_sigmoid_mul`` (PR #28293), each fixed by taking NPU off the Triton kernel.
The property is the same every time, so NPP003 tests it for every kernel on the path.

Static probe (the source read with ``ast``; sglang is never imported):

* **The path**: each role's NPU path (``npudoctor.static.npupath.role_paths``: the functions the
  role runs on Ascend, NPU-dead branches left out). From every function on it the probe finds the
  Triton launches ``k[grid](...)`` it makes, directly or through the functions it calls with its
  arguments bound (``grids.py``). A name is resolved as an Ascend host binds it: ``if _is_npu:
  f = f_npu`` after ``from ... import f`` leaves the NPU function, not the Triton one (0.5.10's
  ``gdn_backend.py``, 0.5.11's ``qwen3_next.py``), and a call under a branch the deployment's
  numbers decide against (``num_v_heads // num_k_heads in [1, 2, 4]`` for the model's config) is
  not taken.
* **The grid** (``npudoctor.static.intervals``): each dimension evaluated to an interval at T
  tokens: activations (a ``forward*`` method's tensors) have T rows, ``x.shape[0]`` and what keeps
  it (projections, views, ``torch.empty((n, ...))``, returned tensors) follow T; heads come from
  config.json and the TP size; constexpr block sizes from the launch, else the kernel's defaults,
  else the smallest autotune config (the largest grid; said in the evidence).
* **T** (``tokens.py``): the most tokens one forward of the role carries: the chunked prefill
  size (unset: the largest NPU default the release's ``set_default_server_args`` may pick; per DP
  rank with DP attention), max(context length, max_prefill_tokens) with chunked prefill disabled,
  and for decode forwards (a PD decode role; functions named ``*decode*`` or under
  ``is_decode()``) the running requests x speculative draft tokens. The rules and their sglang
  file:line are in ``tokens.py``.

Verdict: a grid whose product at T is certainly over 65535 is ``fail``, naming the kernel, the
grid expression and its value, the tokens, and the flag value that keeps one forward under the
limit; a grid that follows T but has a dimension the probe cannot evaluate, over the limit at
its upper bound, is ``warn``; a grid that does not visibly follow the tokens is not judged.
Otherwise ``pass``.
"""

from __future__ import annotations

from npudoctor.deployment.facts import Facts
from npudoctor.engine.check import Check, Probe
from npudoctor.engine.kinds import CheckKind
from npudoctor.results import Impact
from npudoctor.target.discovery import Target


class KernelGridLimits(Check):
    """NPP003: Triton grids on the NPU path stay within 65535 at the deployment's tokens per forward."""

    id = "NPP003"
    kind = CheckKind.PROPERTY  # not in the default selection: it walks the whole NPU path
    title = (
        "Every Triton kernel launched on the NPU path keeps its grid within 65535 for the deployment's tokens"
    )
    upstream = (
        "https://github.com/sgl-project/sglang/pull/23815",
        "https://github.com/sgl-project/sglang/pull/19756",
        "https://github.com/sgl-project/sglang/pull/28293",
    )
    impact = Impact.RUNTIME_CRASH
    why = (
        "Ascend launches a Triton grid only while the product of its dimensions fits 16 bits (65535); "
        "a CUDA kernel with one program per token (x heads) on the NPU path kills the scheduler at the "
        "first forward that carries enough tokens."
    )
    bites_when = (
        "A Triton kernel on the role's NPU path has a grid that grows with the tokens of a forward, and "
        "the role's chunked prefill size (or max prefill tokens / context length with chunking "
        "disabled, or running requests x draft tokens for decode) takes it over 65535."
    )
    how_to_fix = (
        "lower --chunked-prefill-size (or --max-running-requests) to the value the evidence names, or "
        "upgrade to a release that takes NPU off the kernel"
    )
    runtime_fix = False

    def static(self, target: Target, facts: Facts) -> Probe:
        """Evaluate every Triton grid on each role's NPU path at its tokens per forward (``static.probe``)."""
        from .static import probe  # not loaded when the answer is cached

        return probe(target.tree, facts)


CHECK = KernelGridLimits()
