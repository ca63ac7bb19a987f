"""NPD007's dry run of one role, in an interpreter of its own.

The interpreter becomes an Ascend host with one simulated NPU before anything imports sglang
(``npudoctor.live.ascendsim``), writes the small model's config.json, and starts sglang's real
scheduler process entry (``run_scheduler_process`` in ``srt/managers/scheduler.py``, the function
the server's launcher runs per rank) with the role's server arguments: distributed groups, the model
built from the config with sglang's dummy (random-weight) loader, the memory pools, the attention
backend, the radix cache. Then it plays the tokenizer's part on the scheduler's own IPC sockets:
requests go in through ``scheduler_input_ipc_name`` as ``TokenizedGenerateReqInput`` (what the
tokenizer manager sends), their tokens come out on ``tokenizer_ipc_name`` (with
``skip_tokenizer_init`` the scheduler sends its outputs straight to the tokenizer side, past the
detokenizer: ``SchedulerIpcChannels`` in 0.5.23, ``init_sockets`` before). The requests reach
each step the role serves (``outcome.STEPS``): prefill of sequences of different lengths together, a
prompt longer than the chunk size, a prompt that shares two pages with a finished one, decode.

What sglang raises ends the run as a finding at the step it was in; a call the simulation cannot
answer (``SimulationGap``) or a module this host lacks (``StoodInError``) ends it as a gap: npudoctor
cannot tell, never a verdict on sglang. The scheduler's own crash handler (which signals the
parent process) is never reached: exceptions are taken before it.

Run as ``python -I interpreters.py npudoctor.checks.npd007_dry_run.serve <paths> <scratch>``; the request is
pickled on stdin, the ``DryRunOutcome`` pickled on stdout.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import inspect
import json
import os
import pickle
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from npudoctor import interpreters

from .outcome import (
    BATCHED_PREFILL,
    CHUNKED_PREFILL,
    DECODE,
    PREFILL,
    PREFIX_HIT,
    START_UP,
    STEPS,
    DryRunOutcome,
    Step,
)

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
# Bounds of the run: the KV pool's tokens, the chunk a long prompt is cut in, the batches it may
# take, and its wall time (a hang is reported as one, not waited for).
KV_TOKENS = 8192
CHUNK_TOKENS = 1024
MAX_BATCHES = 200
MAX_SECONDS = 300.0


class _Failed(BaseException):
    """sglang raised: carried past sglang's own ``except Exception`` crash handler."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class _Finished(BaseException):
    """Every request finished: leave the scheduler's event loop."""


class _TimedOut(BaseException):
    pass


def _guarded(function: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            raise _Failed(error) from error

    call.__wrapped__ = function  # type: ignore[attr-defined]
    return call


# ----- server arguments --------------------------------------------------------------------------
_NOT_SIMULATED = {
    # server arg -> (the value that turns the feature off, what is not run)
    "tp_size": (1, "tensor parallelism: ran one rank holding the whole small model"),
    "pp_size": (1, "pipeline parallelism: ran one stage holding every layer"),
    "dp_size": (1, "data parallelism: ran one replica"),
    "ep_size": (1, "expert parallelism: ran every expert on one rank"),
    "attn_cp_size": (1, "attention context parallelism"),
    "nnodes": (1, "multi-node"),
    "speculative_algorithm": (None, "speculative decoding (draft and verify)"),
    "enable_hierarchical_cache": (False, "HiCache write-back and load"),
    "enable_lora": (False, "LoRA adapters"),
    "lora_paths": (None, "LoRA adapters"),
    "enable_dp_attention": (False, "DP attention"),
}


def server_args_for(
    role_args: dict[str, Any], accepted: set[str], model_path: str
) -> tuple[dict[str, Any], list[str], list[str]]:
    """The role's server arguments for the dry run: (arguments, adjusted, not simulated).

    The role's own values stay, except: the model (the small one, random weights, no tokenizer),
    the bounds (KV pool, chunk size) and the features one simulated device cannot serve, each said."""
    given = {k: v for k, v in role_args.items() if k in accepted}
    adjusted: list[str] = []
    not_simulated: list[str] = []
    for key, (off, what) in _NOT_SIMULATED.items():
        value = given.get(key)
        if key in accepted and value not in (None, off, 0, False, 1, "null") and value != off:
            not_simulated.append(f"{what} ({key}={value})")
            given[key] = off
    if not given.get("disable_cuda_graph"):
        not_simulated.append(
            "NPU graph capture and replay: decode ran eagerly (the simulated NPU has no graphs)"
        )
    pd = given.get("disaggregation_mode") in ("prefill", "decode")
    if pd:
        backend = given.get("disaggregation_transfer_backend") or "mooncake"
        not_simulated.append(
            f"the KV transfer engine ({backend}): the role builds its tables as for {backend}; sglang's "
            "own fake transfer classes register them and move no KV (as its PD warm-up requests)"
        )
    forced: dict[str, Any] = {
        "model_path": model_path,
        "tokenizer_path": None,
        "skip_tokenizer_init": True,
        "load_format": "dummy",
        "device": "npu",
        "disable_cuda_graph": True,
        "max_total_tokens": KV_TOKENS,
        "chunked_prefill_size": CHUNK_TOKENS,
        "random_seed": 0,
        "trust_remote_code": False,
    }
    why = {
        "load_format": "random weights (sglang's dummy loader)",
        "max_total_tokens": "the KV pool bounded for the CPU",
        "chunked_prefill_size": "a prompt longer than it is cut in chunks",
    }
    for key, value in forced.items():
        if key not in accepted:
            continue
        before = given.get(key)
        if key in why and before is not None and before != value:
            adjusted.append(f"{key} {before} -> {value}: {why[key]}")
        given[key] = value
    return given, adjusted, not_simulated


# ----- the tokenizer's side of the scheduler's sockets ---------------------------------------------
class _Requests:
    """The requests of a dry run and what came back for them."""

    def __init__(
        self,
        vocab: int,
        chunk: int,
        request_class: type,
        sampling: Any,
        bootstrap_host: str | None,
    ):
        self.request_class = request_class
        self.bootstrap_host = bootstrap_host  # PD: sglang's fake peer (FAKE_BOOTSTRAP_HOST)
        self.rooms = 0
        self.sampling = sampling
        self.vocab = vocab
        self.chunk = chunk
        self.phases: list[dict[str, tuple[list[int], int]]] = []
        self.planned = threading.Event()
        # held while a phase is sent and while the scheduler receives: a phase arrives whole, so
        # its prompts can be scheduled together (the scheduler polls between two sends otherwise)
        self.arriving = threading.RLock()
        self.received = 0  # the requests the scheduler's receive returned
        self.finished: dict[str, Any] = {}
        self.cached_tokens: dict[str, int] = {}
        self.sent: list[str] = []
        self.failure: BaseException | None = None

    def plan(self, page: int) -> None:
        """The prompts, sized by the KV page the scheduler runs with: its own ``page_size`` once it
        started (a platform's default, 128 on NPU, is resolved inside sglang, not in the arguments
        given), so the shared prefix spans whole pages the radix cache keeps."""
        rng = random.Random(0)
        top = max(self.vocab - 1, 8)

        def tokens(n: int) -> list[int]:
            return [rng.randrange(3, top) for _ in range(n)]

        shared = tokens(2 * page + 11)  # two whole pages and more: a prefix the cache keeps
        # sent phase by phase, each once the one before finished: two prompts of different lengths
        # prefilled together (within one chunk), a prompt longer than the chunk, then a prompt that
        # shares the first one's two pages
        self.phases = [
            {"long": (shared, 4), "short": (tokens(max(page // 2, 8) + 3), 3)},
            {"chunked": (tokens(self.chunk + page + 5), 2)},
            {"prefix": (shared[: 2 * page] + tokens(9), 2)},
        ]
        self.planned.set()

    def request(self, rid: str, ids: list[int], new_tokens: int) -> Any:
        sampling = self.sampling(max_new_tokens=new_tokens, temperature=0.0)
        with contextlib.suppress(Exception):
            sampling.normalize(None)
        parameters = inspect.signature(self.request_class).parameters
        input_ids: Any = ids
        if "array" in str(parameters["input_ids"].annotation):
            input_ids = array.array("q", ids)  # 0.5.22+: the tokenizer manager sends an array
        values = {
            "rid": rid,
            "input_text": "",
            "input_ids": input_ids,
            "mm_inputs": None,
            "input_embeds": None,
            "token_type_ids": None,
            "sampling_params": sampling,
            "return_logprob": False,
            "logprob_start_len": -1,
            "top_logprobs_num": 0,
            "token_ids_logprob": None,
            "stream": False,
        }
        if self.bootstrap_host is not None:
            self.rooms += 1
            values.update(bootstrap_host=self.bootstrap_host, bootstrap_port=None, bootstrap_room=self.rooms)
        return self.request_class(**{k: v for k, v in values.items() if k in parameters})

    def serve(self, zmq: Any, scheduler_input: str, outputs: str) -> None:
        try:
            context = zmq.Context()
            results = context.socket(zmq.PULL)
            results.bind(outputs)
            requests = context.socket(zmq.PUSH)
            requests.bind(scheduler_input)
            if not self.planned.wait(MAX_SECONDS):
                return
            for phase in self.phases:
                with self.arriving:
                    for rid, (ids, new_tokens) in phase.items():
                        requests.send_pyobj(self.request(rid, ids, new_tokens))
                        self.sent.append(rid)
                while not all(rid in self.finished for rid in phase):
                    self._read(results.recv_pyobj())
        except BaseException as error:  # the run reports it: a thread's exception is otherwise lost
            self.failure = error

    def _read(self, output: Any) -> None:
        rids = getattr(output, "rids", None) or []
        reasons = getattr(output, "finished_reasons", None) or [None] * len(rids)
        cached = getattr(output, "cached_tokens", None) or [0] * len(rids)
        for rid, reason, tokens in zip(rids, reasons, cached, strict=False):
            if reason:
                self.finished[rid] = reason
                self.cached_tokens[rid] = int(tokens or 0)

    @property
    def done(self) -> bool:
        return self.planned.is_set() and all(rid in self.finished for phase in self.phases for rid in phase)


# ----- the run -------------------------------------------------------------------------------------
class _Watch:
    """The steps the scheduler's batches reached, and the step running now."""

    def __init__(self) -> None:
        self.current = START_UP
        self.batches: dict[str, int] = {}  # step -> batches of it that ran to their end
        self.running: list[str] = []  # the steps of the batch running now
        self.scheduler: Any = None  # the scheduler, once it schedules
        self.last = START_UP  # the step of the last batch that ran to its end
        self.count = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def saw(self, step: str) -> None:
        self.running.append(step)

    def batch_done(self) -> None:
        self.last = self.current
        for step in self.running:
            self.batches[step] = self.batches.get(step, 0) + 1
        self.running = []

    def classify(self, batch: Any) -> None:
        self.count += 1
        self.running = []
        mode = batch.forward_mode
        if mode.is_decode():
            self.current = DECODE
            self.saw(DECODE)
            return
        if not mode.is_extend():
            self.current = f"{mode.name.lower()} batch"
            return
        self.current = PREFILL
        self.saw(PREFILL)
        rids = [r.rid for r in batch.reqs]
        if len(rids) > 1:
            self.current = BATCHED_PREFILL
            self.saw(BATCHED_PREFILL)
        if "chunked" in rids:  # the prompt longer than the chunk: chunked if it takes several batches
            self.current = CHUNKED_PREFILL
            self.saw(CHUNKED_PREFILL)
        if any(r.rid == "prefix" and _prefix_length(r) > 0 for r in batch.reqs):
            self.current = PREFIX_HIT
            self.saw(PREFIX_HIT)


def _prefix_length(req: Any) -> int:
    """The tokens of ``req`` the radix cache served: its ``prefix_len`` (0.5.23, the matched prefix
    kept as a length) or its ``prefix_indices`` (the matched KV slots, before)."""
    length = getattr(req, "prefix_len", None)
    if isinstance(length, int):
        return length
    return len(getattr(req, "prefix_indices", ()))


def _bind(function: Any, known: dict[str, Any]) -> dict[str, Any]:
    """Arguments for sglang's ``function`` by parameter name; a required one npudoctor does not
    know is npudoctor's gap (a release's new entry argument), not sglang's defect."""
    arguments = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if name in known:
            arguments[name] = known[name]
        elif parameter.default is inspect.Parameter.empty:
            from npudoctor.live.ascendsim import SimulationGap

            raise SimulationGap(f"{function.__qualname__}({name}=...)", "an argument npudoctor does not know")
    return arguments


class _InitWriter:
    """The pipe the launcher reads the scheduler's readiness from: once it is written, start-up is
    over and the first prefill is being scheduled."""

    def __init__(self, watch: _Watch) -> None:
        self.info: Any = None
        self.watch = watch

    def send(self, info: Any) -> None:
        self.info = info
        self.watch.current = PREFILL


def run(request: dict[str, Any]) -> DryRunOutcome:
    from npudoctor.live import ascendsim, standins
    from npudoctor.live.locations import code_location

    started = time.perf_counter()
    outcome = DryRunOutcome(role=request["role"], model=list(request.get("model_description", ())))
    ascendsim.install()
    model_dir = Path(request["scratch"], "model")
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(request["model_config"]))
    watch = _Watch()
    try:
        standins.import_with_stand_ins(
            lambda: importlib.import_module(SCHEDULER_MODULE), "dry run", absent=ascendsim.CUDA_ONLY_PACKAGES
        )
        scheduler_module = sys.modules[SCHEDULER_MODULE]
        server_args_module = importlib.import_module("sglang.srt.server_args")
        io_struct = importlib.import_module("sglang.srt.managers.io_struct")
        sampling_module = importlib.import_module("sglang.srt.sampling.sampling_params")
        import zmq
    except BaseException as error:  # an import on the NPU path failed: start-up is where it shows
        return _ended(outcome, START_UP, error, started)
    outcome.stood_in = dict(standins.stood_in)
    ascendsim.RECORD.running = True
    standins.stand_in_late_imports(ascendsim.CUDA_ONLY_PACKAGES, "dry run, while serving")
    scheduler_class = scheduler_module.Scheduler
    entry = scheduler_module.run_scheduler_process
    where = code_location(entry)
    outcome.release_entry = f"{where.path}:{where.line}" if where else ""
    accepted = set(inspect.signature(server_args_module.ServerArgs).parameters)
    given, outcome.adjusted, outcome.not_simulated = server_args_for(
        request["server_args"], accepted, str(model_dir)
    )
    try:
        with standins.probing():
            server_args = server_args_module.ServerArgs(**given)
            port_args = server_args_module.PortArgs.init_new(server_args)
    except BaseException as error:
        return _ended(outcome, START_UP, error, started)
    chunk = int(getattr(server_args, "chunked_prefill_size", None) or CHUNK_TOKENS)
    bootstrap_host = None
    if getattr(server_args, "disaggregation_mode", "null") in ("prefill", "decode"):
        bootstrap_host = importlib.import_module("sglang.srt.disaggregation.utils").FAKE_BOOTSTRAP_HOST
        _fake_transfer()
    requests = _Requests(
        int(request["model_config"].get("vocab_size") or 512),
        chunk,
        io_struct.TokenizedGenerateReqInput,
        sampling_module.SamplingParams,
        bootstrap_host,
    )
    _instrument(scheduler_class, watch, requests)
    writer = _InitWriter(watch)
    known = {
        "server_args": server_args,
        "port_args": port_args,
        "gpu_id": 0,
        "tp_rank": 0,
        "moe_ep_rank": 0,
        "pp_rank": 0,
        "attn_cp_rank": 0,
        "moe_dp_rank": 0,
        "dp_rank": None,
        "pipe_writer": writer,
    }
    client = threading.Thread(
        target=requests.serve,
        args=(zmq, port_args.scheduler_input_ipc_name, port_args.tokenizer_ipc_name),
        daemon=True,
    )
    client.start()
    try:
        with standins.probing():
            entry(**_bind(entry, known))
    except _Finished:
        pass
    except BaseException as error:
        return _ended(outcome, watch.current, error, started, watch)
    finally:
        outcome.ops = dict(ascendsim.RECORD.ops)
        outcome.gaps = dict(ascendsim.RECORD.gaps)
    _steps(outcome, watch, requests, ended=None)
    _served_by(outcome, watch.scheduler, request["model_config"])
    outcome.seconds = time.perf_counter() - started
    return outcome


def _served_by(outcome: DryRunOutcome, scheduler: Any, config: dict[str, Any]) -> None:
    """Which class served the model. sglang's model registry skips a model module that fails to
    import (it logs "Ignore import error when loading ...") and may serve the architecture through
    another implementation (the Transformers backend): the deployment then runs code it did not
    ask for. Where the served class is not sglang's own class of the config's architecture, the
    module defining that class is imported again here, and why it fails is kept."""
    from npudoctor.live.locations import Raised

    worker = getattr(scheduler, "tp_worker", None)
    runner = getattr(worker, "model_runner", None) or getattr(
        getattr(worker, "worker", None), "model_runner", None
    )
    model = getattr(runner, "model", None)
    if model is None:
        return
    served = type(model)
    outcome.served_by = f"{served.__module__}.{served.__qualname__}"
    wanted = (config.get("architectures") or [None])[0]
    if not wanted or served.__name__ == wanted:
        return
    module = _module_defining(wanted)
    if module is None:
        return
    try:
        importlib.import_module(module)
    except Exception as error:
        outcome.model_import_failure = Raised.of(error)


def _module_defining(architecture: str) -> str | None:
    """The sglang model module that defines ``class <architecture>(``, read from the tree."""
    models = importlib.import_module("sglang.srt.models")
    for folder in getattr(models, "__path__", []):
        for path in sorted(Path(folder).glob("*.py")):
            if f"class {architecture}(" in path.read_text(errors="replace"):
                return f"sglang.srt.models.{path.stem}"
    return None


def _requests_in(received: list) -> int:
    return sum(1 for item in received if type(item).__name__ == "TokenizedGenerateReqInput")


def _fake_transfer() -> None:
    """The KV transfer engine has no peer here: every backend's manager, sender, receiver and
    bootstrap server are sglang's own fake ones (``disaggregation/fake``), what its PD warm-up
    requests use. The tables the role builds for them (``_init_kv_manager``: the pools' buffer
    tables) are the backend's; only the engine that would register and move them is replaced.
    ``get_kv_class`` is rebound where sglang's modules imported it by name."""
    utils = importlib.import_module("sglang.srt.disaggregation.utils")
    original = utils.get_kv_class
    fake = utils.TransferBackend.FAKE

    def get_kv_class(transfer_backend: Any, class_type: Any) -> Any:
        if class_type.name in ("KVARGS",):
            return original(transfer_backend, class_type)
        return original(fake, class_type)

    for module in list(sys.modules.values()):
        if getattr(module, "get_kv_class", None) is original:
            module.get_kv_class = get_kv_class


def _instrument(scheduler_class: Any, watch: _Watch, requests: _Requests) -> None:
    """Watch the scheduler's batches and end its loop once every request finished."""
    initialise = _guarded(scheduler_class.__init__)

    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        initialise(self, *args, **kwargs)
        # the scheduler is up: the prompts are sized by its own page (every event loop, PD's too)
        watch.scheduler = self
        requests.plan(int(getattr(self, "page_size", None) or 1))

    scheduler_class.__init__ = start
    # the loop run_scheduler_process enters: ``run_event_loop`` (0.5.5 on), or before it one of the
    # ``event_loop_*`` methods it picks itself (0.5.4: normal, overlap, pp, disaggregation's)
    loops = (
        ["run_event_loop"]
        if hasattr(scheduler_class, "run_event_loop")
        else [name for name in dir(scheduler_class) if name.startswith("event_loop_")]
    )
    for name in loops:
        setattr(scheduler_class, name, _guarded(getattr(scheduler_class, name)))
    next_batch = scheduler_class.get_next_batch_to_run
    run_batch = scheduler_class.run_batch
    # the scheduler's receive of new requests: ``recv_requests`` (to 0.5.22), ``ingest_requests``
    receive_name = "recv_requests" if hasattr(scheduler_class, "recv_requests") else "ingest_requests"
    receive = getattr(scheduler_class, receive_name, None)

    def receive_whole_phases(self: Any, *args: Any, **kwargs: Any) -> Any:
        """Every request the client sent is received before the scheduler schedules: the IPC
        socket delivers a second message a moment after the first, and a busy host's scheduler
        would otherwise schedule the first alone (no prefill of several sequences)."""
        with requests.arriving:
            received = receive(self, *args, **kwargs)
            if not isinstance(received, list):
                return received
            requests.received += _requests_in(received)
            deadline = time.monotonic() + 10
            while requests.received < len(requests.sent) and time.monotonic() < deadline:
                time.sleep(0.01)
                more = receive(self, *args, **kwargs)
                if not isinstance(more, list):
                    break
                requests.received += _requests_in(more)
                received = received + more
            return received

    if receive is not None:
        setattr(scheduler_class, receive_name, receive_whole_phases)

    def get_next_batch_to_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if requests.done:
            raise _Finished()
        if requests.failure is not None:
            raise _Failed(requests.failure)
        if watch.count > MAX_BATCHES or time.monotonic() > watch.deadline:
            raise _TimedOut()
        if watch.count:  # what raises now raises while the next batch is prepared
            watch.current = f"scheduling after {watch.last}"
        return next_batch(self, *args, **kwargs)

    def run_one_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        watch.classify(batch)
        result = run_batch(self, batch, *args, **kwargs)
        watch.batch_done()
        return result

    scheduler_class.get_next_batch_to_run = get_next_batch_to_run
    scheduler_class.run_batch = run_one_batch


def _ended(
    outcome: DryRunOutcome,
    step: str,
    error: BaseException,
    started: float,
    watch: _Watch | None = None,
) -> DryRunOutcome:
    from npudoctor.live import ascendsim, standins
    from npudoctor.live.locations import Raised

    if isinstance(error, _Failed):
        error = error.error
    outcome.ops = dict(ascendsim.RECORD.ops)
    outcome.gaps = dict(ascendsim.RECORD.gaps)
    outcome.stood_in = dict(standins.stood_in)
    if isinstance(error, _TimedOut):
        outcome.failed_step = step
        outcome.error = (
            f"the run did not finish within {MAX_BATCHES} batches / {MAX_SECONDS:.0f} s "
            f"(at {step}): a hang or a request never scheduled"
        )
    elif isinstance(error, (ascendsim.SimulationGap, standins.StoodInError)):
        outcome.gap, outcome.gap_step = str(error), step
    elif _torch_lacks(error):
        import torch

        outcome.gap = f"this host's torch {torch.__version__} lacks what this release uses: {error}"
        outcome.gap_step = step
    elif _host_lacks(error):
        outcome.gap = f"sglang imported {error.name!r}, which this host lacks (an Ascend host has it)"
        outcome.gap_step = step
    else:
        outcome.failed_step = step
        outcome.failure = Raised.of(error)
    _steps(outcome, watch, None, ended=step)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _torch_lacks(error: BaseException) -> bool:
    """sglang asked torch for a name this host's torch does not have (``torch._C._cpu.
    _is_amx_tile_supported`` for 0.4.10 on torch 2.13): the live environment's torch is not the one
    the release was built for. The release pins its own torch; the host's stack is what differs."""
    return isinstance(error, AttributeError) and str(error).startswith("module 'torch")


def _host_lacks(error: BaseException) -> bool:
    """``error`` is a lazy import, while sglang serves, of a third-party module this host does not
    have (0.5.12's scheduler imports the tokenizer manager, and with it ``fastapi`` and ``uvloop``,
    on its first request): the stand-ins cover imports before the run only, so this is the host's
    gap, not sglang's defect. A CUDA-only package (missing on an Ascend host too) and sglang's own
    modules stay failures."""
    import importlib.util

    from npudoctor.live import ascendsim

    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return False
    root = error.name.split(".")[0]
    if root == "sglang" or root in ascendsim.CUDA_ONLY_PACKAGES:
        return False
    return importlib.util.find_spec(root) is None


def _steps(
    outcome: DryRunOutcome, watch: _Watch | None, requests: _Requests | None, ended: str | None
) -> None:
    """Every step, ran or not, and why not."""
    batches = watch.batches if watch is not None else {}
    for name in STEPS:
        if name == START_UP:
            ran = ended != START_UP
            detail = "the scheduler started" if ran else "ended by the exception"
        else:
            count = batches.get(name, 0)
            ran = count > 0
            detail = f"{count} batch{'es' if count != 1 else ''}" if count else ""
            if name == CHUNKED_PREFILL and ran and count < 2:
                ran, detail = False, f"the long prompt took {count} batch: it was not chunked"
            if name == PREFIX_HIT and ran and requests is not None:
                hit = requests.cached_tokens.get("prefix", 0)
                ran = hit > 0
                detail += f"; {hit} prompt tokens served from the cache"
            if ended == name:
                detail = (detail + "; " if detail else "") + "a batch of it raised"
            elif not count:
                detail = (
                    f"not reached: the run ended at {ended}" if ended is not None else "no batch of this kind"
                )
        outcome.steps.append(Step(name, ran, detail))


def main() -> int:
    from npudoctor.live import sealing

    sealing.use_scratch(Path(sys.argv[1]))
    sealing.seal()
    request = pickle.loads(sys.stdin.buffer.read())
    interpreters.die_with_parent(request["parent"])
    sys.stdout.flush()
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    delivered = threading.Lock()

    def deliver(outcome: DryRunOutcome) -> None:
        if delivered.acquire(blocking=False):
            answer.write(pickle.dumps(outcome))
            answer.close()

    _watch_for_a_hang(request.get("role", "?"), deliver)
    try:
        outcome = run({**request, "scratch": sys.argv[1]})
    except BaseException as error:  # npudoctor's own failure: said, never a verdict on sglang
        outcome = DryRunOutcome(role=request.get("role", "?"), error=f"{type(error).__name__}: {error}")
    deliver(outcome)
    return 0


def _watch_for_a_hang(role: str, deliver: Any) -> None:
    """A run that has not ended after ``MAX_SECONDS`` (sglang waiting on something that never
    comes: a peer, a lock, a device) is reported where sglang's main thread waits, and the
    interpreter ends: npudoctor is never held for longer."""
    from npudoctor.live import ascendsim
    from npudoctor.live.locations import frame_location

    main_thread = threading.main_thread().ident

    def watch() -> None:
        time.sleep(MAX_SECONDS + 30)
        frame = sys._current_frames().get(main_thread)
        where = None
        while frame is not None and where is None:
            where = frame_location(frame)
            frame = frame.f_back if where is None else frame
        at = f"{where.path}:{where.line} ({where.symbol})" if where else "outside sglang's code"
        outcome = DryRunOutcome(
            role=role,
            gap=f"the run did not end within {MAX_SECONDS + 30:.0f} s: sglang's main thread waits at {at}",
            gap_step="serving",
            ops=dict(ascendsim.RECORD.ops),
            gaps=dict(ascendsim.RECORD.gaps),
        )
        deliver(outcome)
        from npudoctor.live.child_process import exit_now

        exit_now(0)

    threading.Thread(target=watch, daemon=True, name="npudoctor-hang-watch").start()


if __name__ == "__main__":
    from npudoctor.checks.npd007_dry_run.serve import main as serve_main
    from npudoctor.live.child_process import exit_now

    exit_now(serve_main())
