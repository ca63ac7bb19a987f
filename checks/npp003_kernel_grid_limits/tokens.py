"""The most tokens one forward of a role carries, from its server arguments and the release's NPU defaults.

The scheduler bounds a prefill forward by the chunk budget: ``PrefillAdder`` starts
``rem_chunk_tokens`` at ``--chunked-prefill-size`` and takes every request's extend tokens off it
(0.5.10 ``managers/schedule_policy.py:399``, ``:533``; a request longer than what is left is cut to
it, ``:818``), and ``--enable-mixed-chunk`` takes the running decode tokens off the same budget
(``:406``), so one prefill forward holds at most the chunk. ``chunked_prefill_size`` <= 0 (``-1``)
disables chunking (``rem_chunk_tokens`` None): the first request then goes in whole, however long
(up to the context length), and further ones only while ``max_prefill_tokens`` lasts (``:767``),
so a forward holds up to max(context length, max_prefill_tokens). Unset, the NPU default applies:
``hardware_backend/npu/utils.py`` ``set_default_server_args`` picks 4096 on 32 GB cards and 8192
on 64 GB cards (0.5.10 ``:62``, ``:72``; 0.5.23 ``:112``, ``:142``); the largest it may pick is the
deployment's, read from the release's own file. With DP attention every attention-DP rank gets
``chunked_prefill_size // dp_size`` (0.5.10 ``server_args.py:2641``, 0.5.23
``arg_groups/parallel_hook.py:331``); the layers after the DP gather see the ranks' tokens together.

A decode forward holds one token per running request, ``speculative_num_draft_tokens`` per request
when a speculative algorithm verifies drafts; the requests of one DP worker are at most
``max(min(estimated, 4096), 2048)`` (0.5.10 ``model_executor/model_runner_kv_cache_mixin.py:845``),
``--max-running-requests`` (divided by dp) below that. A graph replay holds at most
``cuda_graph_max_bs`` x draft tokens (larger batches run eagerly): the bound of code that runs only
under ``forward_mode.is_cuda_graph()``; unset, the NPU default is 64 below TP 4 and 256 from TP 4
on 64 GB cards (0.5.10 ``hardware_backend/npu/utils.py:74``, read from the release's file).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from npudoctor.deployment.facts import ModelFacts, RoleFacts
from npudoctor.static.source import SourceTree, flatten_conditional

NPU_DEFAULT_CHUNK = 8192  # when the release's set_default_server_args cannot be read
MAX_PREFILL_TOKENS = 16384  # ServerArgs.max_prefill_tokens, 0.5.x
MAX_REQUESTS_PER_WORKER = 4096  # the request pool's cap (see the module docstring)
AUTO_DRAFT_TOKENS = 4  # auto_choose_speculative_params' usual (3, 1, 4)


@dataclass
class Budget:
    """The tokens of one forward of a role, per phase, and how each was derived."""

    prefill: int | None  # None: the role does not prefill (a PD decode server)
    decode: int
    chunk: int | None  # the chunked prefill size in force (after the NPU default), None if disabled
    chunk_given: bool
    dp: int
    page_size: int
    notes: list[str] = field(default_factory=list)
    draft: int = 1  # tokens per request in a decode forward (speculative draft tokens, else 1)
    graph: int = 0  # tokens of one graph replay (cuda_graph_max_bs x draft tokens); 0: no graphs

    @property
    def largest(self) -> int:
        return max(self.prefill or 0, self.decode)

    def phase_tokens(self, phase: str) -> int:
        if phase == "graph":
            return self.graph
        if phase == "decode" or self.prefill is None:
            return self.decode
        return max(self.prefill, self.decode)

    def flag_for(self, tokens: int, phase: str) -> str:
        """The flag value that keeps one forward at or under ``tokens`` tokens."""
        if phase == "graph":
            return f"--cuda-graph-max-bs {max(tokens // self.draft, 1)}"
        if phase != "decode" and self.prefill is not None and self.prefill > self.decode:
            chunk = max(tokens // self.page_size * self.page_size, self.page_size) * self.dp
            return f"--chunked-prefill-size {chunk}"
        return f"--max-running-requests {max(tokens // self.draft, 1) * self.dp}"


def role_budget(tree: SourceTree, role: RoleFacts | None, model: ModelFacts | None) -> Budget:
    """The budget of ``role`` (None: one colocated server with the NPU defaults)."""
    args = role.server_args if role is not None else {}
    notes: list[str] = []
    dp = role.dp_size if role is not None and args.get("enable_dp_attention") else 1
    page = role.page_size if role is not None else 128
    chunk_arg = args.get("chunked_prefill_size")
    chunk_given = chunk_arg is not None
    if chunk_given:
        chunk = int(chunk_arg)
    else:
        chunk, where = npu_default_chunk(tree)
        notes.append(f"chunked_prefill_size unset: the NPU default, up to {chunk} ({where})")
    prefill: int | None
    if chunk <= 0:
        context = _context_length(args, model)
        max_prefill = int(args.get("max_prefill_tokens") or _max_prefill_default(tree))
        prefill = max(context or 0, max_prefill)
        notes.append(
            f"chunked prefill disabled: one prefill forward holds up to max(context length {context}, "
            f"max_prefill_tokens {max_prefill}) = {prefill} tokens"
        )
        chunk_value: int | None = None
    else:
        chunk_value = chunk
        prefill = chunk // dp
        if dp > 1:
            notes.append(
                f"DP attention: each of {dp} ranks prefills up to {chunk} // {dp} = {prefill} tokens"
            )
    if role is not None and role.disaggregation_mode == "decode":
        prefill = None  # a PD decode server receives the KV; it runs no prefill forward
        notes.clear()
    requests = MAX_REQUESTS_PER_WORKER
    if args.get("max_running_requests"):
        requests = min(
            max(int(args["max_running_requests"]) // max(role.dp_size if role else 1, 1), 1), requests
        )
    draft = 1
    if role is not None and role.speculative_algorithm:
        if args.get("speculative_num_draft_tokens"):
            draft = int(args["speculative_num_draft_tokens"])
        elif args.get("speculative_num_steps"):
            draft = int(args["speculative_num_steps"]) + 1
        else:
            draft = AUTO_DRAFT_TOKENS
            notes.append(f"speculative_num_draft_tokens unset: assumed the automatic {draft}")
    budget = Budget(prefill, requests * draft, chunk_value, chunk_given, dp, page, notes, draft)
    if not args.get("disable_cuda_graph"):
        if args.get("cuda_graph_bs"):
            graph_bs = max(int(b) for b in args["cuda_graph_bs"])
        elif args.get("cuda_graph_max_bs"):
            graph_bs = int(args["cuda_graph_max_bs"])
        else:
            small, large, where = npu_default_graph_bs(tree)
            graph_bs = small if (role.tp_size if role is not None else 1) < 4 else large
            notes.append(f"cuda_graph_max_bs unset: the NPU default, up to {graph_bs} ({where})")
        budget.graph = graph_bs * draft
    return budget


def npu_default_chunk(tree: SourceTree) -> tuple[int, str]:
    """The largest ``chunked_prefill_size`` the release's NPU ``set_default_server_args`` sets, with
    its file:line (memoised per tree)."""
    memo = tree.memo.setdefault("npp003.chunk", {})
    if "value" not in memo:
        memo["value"] = _read_npu_default(tree)
    return memo["value"]


def npu_default_graph_bs(tree: SourceTree) -> tuple[int, int, str]:
    """The largest graph batch size the release's NPU ``set_default_server_args`` sets below TP 4
    and from TP 4 on (``if ....tp_size < 4:``), with its file:line (memoised per tree)."""
    memo = tree.memo.setdefault("npp003.graph", {})
    if "value" not in memo:
        memo["value"] = _read_graph_default(tree)
    return memo["value"]


def _read_graph_default(tree: SourceTree) -> tuple[int, int, str]:
    small: list[int] = []
    large: list[int] = []
    where = "not found in this release: assumed 64 below TP 4, 256 from TP 4"
    for path in tree.files_containing("def set_default_server_args", under="srt"):
        module = tree.parse(path)
        for node in ast.walk(module) if module is not None else ():
            if isinstance(node, ast.If) and "tp_size < 4" in ast.unparse(node.test):
                for side, values in ((node.body, small), (node.orelse, large)):
                    for inner in (n for stmt in side for n in ast.walk(stmt)):
                        value = _constant(_set_value(inner, "cuda_graph_max_bs", "max_bs"))
                        if value is not None:
                            values.append(value)
                            where = f"{tree.relpath(path)}:{node.lineno}"
    return (max(small) if small else 64, max(large) if large else 256, where)


def _read_npu_default(tree: SourceTree) -> tuple[int, str]:
    best: tuple[int, str] | None = None
    for path in tree.files_containing("def set_default_server_args", under="srt"):
        module = tree.parse(path)
        if module is None:
            continue
        for node in ast.walk(module):
            value = _set_value(node, "chunked_prefill_size", "chunked_prefill_size")
            number = _constant(value) if value is not None else None
            if number is not None and (best is None or number > best[0]):
                best = (number, f"{tree.relpath(path)}:{value.lineno}")
    return best if best is not None else (NPU_DEFAULT_CHUNK, "not found in this release: assumed 8192")


def _set_value(node: ast.AST, attribute: str, keyword: str) -> ast.expr | None:
    """The value ``<args>.<attribute> = v`` or ``...(<keyword>=v)`` sets, if ``node`` is one."""
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == attribute for t in node.targets
    ):
        return node.value
    if isinstance(node, ast.keyword) and node.arg == keyword:
        return node.value
    return None


def _max_prefill_default(tree: SourceTree) -> int:
    memo = tree.memo.setdefault("npp003.max_prefill", {})
    if "value" not in memo:
        memo["value"] = MAX_PREFILL_TOKENS
        for path in tree.files_containing("max_prefill_tokens: int = ", under="srt"):
            module = tree.parse(path)
            for node in ast.walk(module) if module is not None else ():
                if isinstance(node, ast.ClassDef):
                    for stmt in flatten_conditional(node.body):
                        if (
                            isinstance(stmt, ast.AnnAssign)
                            and isinstance(stmt.target, ast.Name)
                            and stmt.target.id == "max_prefill_tokens"
                            and _constant(stmt.value) is not None
                        ):
                            memo["value"] = _constant(stmt.value)
    return memo["value"]


def _context_length(args: dict, model: ModelFacts | None) -> int | None:
    if args.get("context_length"):
        return int(args["context_length"])
    if model is not None:
        value = model.hf_config.get("max_position_embeddings")
        if isinstance(model.hf_config.get("text_config"), dict):
            value = model.hf_config["text_config"].get("max_position_embeddings", value)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _constant(node: ast.AST | None) -> int | None:
    """An integer constant expression (``8 * 1024``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Pow)):
        left, right = _constant(node.left), _constant(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Mult):
            return left * right
        return left + right if isinstance(node.op, ast.Add) else left**right
    return None
