"""The live child sealed from the host: no model hub, no network, the probe's model served by npudoctor.

A live probe runs sglang's real code, and that code reaches further than the probed function:
0.5.19's ``publish`` of the server arguments runs the resolution pipeline (``ServerArgs.resolve_once``),
whose model hooks build a ``ModelConfig`` from ``model_path`` (``arg_groups/model_override_base.py``
``model_config_of``), which asks transformers for the config (``utils/hf_transformers/config.py:65``
``_try_load_longcat_config``), which asks the Hugging Face hub when the path is not a local directory.
On a host without internet that costs tens of seconds of retries and ends in ``OSError``; on a host
with it, an answer from the hub that no deployment asked for. The verdict must not depend on either.

So the live child (``child_process`` and the test suite's ``zygote``) calls ``seal`` before it
imports sglang:

* every hub the releases consult runs offline, its caches in npudoctor's scratch directory: the
  releases read ``huggingface_hub.constants.HF_HUB_OFFLINE`` (weight and config loaders),
  transformers' offline mode (``TRANSFORMERS_OFFLINE``/``HF_HUB_OFFLINE``), ``HF_HOME`` and
  ``HF_HUB_CACHE``, and go to ModelScope only with ``SGLANG_USE_MODELSCOPE`` (off here);
* outbound sockets are refused (``NetworkSealed``) by an audit hook (``sys.addaudithook``: name
  lookups, ``connect``, ``sendto``, ``sendmsg``); loopback, this host's own name and ``AF_UNIX``
  stay open, as sglang's own process plumbing uses them. Native code that opens sockets without Python's socket module is
  not seen: the hub switches above are the first line, the hook the belt;
* the probe's model path (``processstate.PROBE_MODEL_PATH``) is a directory of the scratch holding
  npudoctor's own copy of the deployment's ``config.json`` (``processstate.serve_model``), so a read
  of it finds the deployment's model, never the user's directory or the hub.

``NPUDOCTOR_LIVE_NETWORK=host`` leaves the hubs and the network as the environment has them (the
probe's model path is still npudoctor's): for comparing verdicts, and for debugging.

An exception caused by the host rather than by sglang (the ``OSError`` family: connections,
timeouts, missing or unreadable files, the hubs' errors, which derive from them, and the refusals
above) that ends a live probe, or that a probe made its evidence of a ``fail``, is judged here
(``ended_by_host``, ``judged``), for every probe, in the one place the child collects them
(``child_process.probe_all``): the probe becomes ``warn``, cannot tell, naming the exception and where
it was raised, never ``fail`` or ``error``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

from npudoctor.engine.check import Probe
from npudoctor.live import locations, processstate
from npudoctor.results import Evidence, Status

NETWORK_ENV = "NPUDOCTOR_LIVE_NETWORK"  # "host": no sealing of the hubs and the network
CAUSED_BY_HOST = "caused by this host, not sglang"

_scratch: list[Path] = []  # this process's scratch directory (forks share their parent's)
_guarded: list[bool] = []  # the audit hook is installed (it cannot be taken out again)


class NetworkSealed(ConnectionRefusedError):
    """An outbound connection or name lookup the sealed live child refused."""


def sealed() -> bool:
    """Whether this process's live runs are sealed from the hubs and the network (the default)."""
    return os.environ.get(NETWORK_ENV, "").strip().lower() != "host"


def use_scratch(directory: Path) -> None:
    """Make ``directory`` this live child's scratch directory. Its caller made it and removes it once
    the child ended, however it ended (a child killed runs no exit handler of its own); the child
    removes it too at its exit, should it outlive its caller. It is the child's temporary directory
    too (``tempfile``, not the environment: ``TMPDIR`` stays the user's), so what the child makes
    there (the stand-ins' metadata, torch's caches) goes with it."""
    _scratch[:] = [directory]
    tempfile.tempdir = str(directory)
    _remove_at_exit(directory)


def scratch() -> Path:
    """npudoctor's scratch directory of this live child (``use_scratch``), else one created on first
    use and removed at its exit."""
    if not _scratch:
        directory = Path(tempfile.mkdtemp(prefix="npudoctor-live-"))
        _remove_at_exit(directory)
        _scratch.append(directory)
    return _scratch[0]


def _remove_at_exit(directory: Path) -> None:
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:  # a forked process leaves its parent's directory alone
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)


def offline_environment(directory: Path) -> dict[str, str]:
    """The variables that put every hub the releases consult offline, with their caches under
    ``directory``."""
    hub = directory / "huggingface"
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(hub),
        "HF_HUB_CACHE": str(hub / "hub"),
        "HUGGINGFACE_HUB_CACHE": str(hub / "hub"),
        "TRANSFORMERS_CACHE": str(hub / "hub"),
        "HF_DATASETS_CACHE": str(hub / "datasets"),
        "HF_MODULES_CACHE": str(hub / "modules"),
        "HF_XET_CACHE": str(hub / "xet"),
        "SGLANG_USE_MODELSCOPE": "false",
        "MODELSCOPE_CACHE": str(directory / "modelscope"),
    }


def seal() -> None:
    """Seal this live child (see the module docstring): before sglang is imported, and again after
    a zygote's probe process takes its run's environment. Idempotent."""
    directory = scratch()
    processstate.serve_model_at(directory / processstate.PROBE_MODEL_NAME)
    if not sealed():
        return
    os.environ.update(offline_environment(directory))
    if not _guarded:
        sys.addaudithook(_refuse_outbound)
        _guarded.append(True)


_LOOPBACK_NAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_HOSTNAME = socket.gethostname().lower()  # this host's own name (sglang looks it up for its own address)
_SENDS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})  # (socket, address)
_LOOKUPS = frozenset({"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"})  # (host, ...)


def _local(host: object) -> bool:
    """Whether ``host`` (a name or an address) is this host: loopback, unspecified, none."""
    if host is None:
        return True
    if isinstance(host, (bytes, bytearray)):
        host = bytes(host).decode(errors="replace")
    if isinstance(host, int):
        return host == 0  # INADDR_ANY
    text = str(host).strip().strip("[]").lower()
    if text in _LOOPBACK_NAMES or text.endswith(".localhost") or text == _HOSTNAME:
        return True
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _refuse_outbound(event: str, args: tuple) -> None:
    """The audit hook: refuse a name lookup or a connection to anything but this host."""
    if not event.startswith("socket."):
        return
    if event in _SENDS:
        sock, address = args[0], args[1]
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6) or not address:
            return
        host = address[0] if isinstance(address, tuple) else address
    elif event in _LOOKUPS:
        host = args[0] if args else None
    elif event == "socket.getnameinfo":
        host = args[0][0] if args and isinstance(args[0], tuple) and args[0] else None
    else:
        return
    if not _local(host):
        raise NetworkSealed(
            errno.ECONNREFUSED,
            f"npudoctor's live child refuses outbound network access ({event.split('.', 1)[1]} {host!r}): "
            "the live depth runs sealed from the network and the model hubs",
        )


# -- exceptions the host caused ------------------------------------------------------------------


def host_cause(error: BaseException | None) -> OSError | None:
    """The exception of the ``OSError`` family that ``error`` is, or was raised from (``raise ...
    from``): what this host did (no connection, a timeout, a file missing or unreadable, a hub's
    answer, a refusal of ``seal``'s hook), not sglang's code."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def _short(filename: str) -> str:
    """A file of an installed package as its import path (``transformers/utils/hub.py``)."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return filename


def _described(error: BaseException, cause: OSError) -> tuple[str, Evidence]:
    """``Type: message at sglang's file:line (raised in file:line)``, and the evidence saying so."""
    where = locations.raising_location(error) or locations.raising_location(cause)
    frames = traceback.extract_tb(cause.__traceback__)
    innermost = frames[-1].filename if frames else ""
    raised = f"{locations.relative(innermost) or _short(innermost)}:{frames[-1].lineno}" if frames else None
    text = f"{type(cause).__name__}: {_first_line(str(cause))}"
    if where is not None:
        text += f" at {where}"
    if raised and (where is None or not raised.startswith(f"{where.path}:")):
        text += f" (raised in {raised})"
    text += f": {CAUSED_BY_HOST}"
    evidence = Evidence(
        expected="the live probe to run sglang's code to its end on this host",
        observed=f"{text} (live, CPU)",
        location=where,
    )
    return text, evidence


def ended_by_host(error: BaseException) -> Probe | None:
    """A probe that raised ``error``: ``warn`` (cannot tell) when the host caused it, else None
    (npudoctor's or sglang's own error, reported as such)."""
    cause = host_cause(error)
    if cause is None:
        return None
    text, evidence = _described(error, cause)
    return Probe(Status.WARN, f"cannot tell: the live probe ended on {text}", (evidence,))


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Around one probe: the exceptions it makes evidence of (``locations.exception_evidence``) are
    the ones ``judged`` looks at; dropped after it (their tracebacks hold the probe's pools)."""
    locations.evidenced.clear()
    try:
        yield
    finally:
        locations.evidenced.clear()


# npudoctor's modules that stand for what an Ascend host has (the NPU runtime, its kernels, modules
# this host lacks): an exception raised there answers for the code that called them, not for npudoctor
_STAND_FOR_THE_HOST = frozenset(
    {"npudoctor.live.npusim", "npudoctor.live.npukernels", "npudoctor.live.standins"}
)


def _stands_for_the_host(module: str) -> bool:
    """``module`` is one of ``_STAND_FOR_THE_HOST`` or inside it (the kernel references are a package)."""
    return any(module == name or module.startswith(name + ".") for name in _STAND_FOR_THE_HOST)


class ProbeOwnError(RuntimeError):
    """A probe's ``fail`` rested on an exception npudoctor's own code raised (a call the probe made
    that could not bind, an assumption of its own): npudoctor's defect, reported as the check's
    ``error``, never as sglang's (NPD003's probe once passed ``model_path`` twice to ``ServerArgs``)."""


def raised_by_npudoctor(error: BaseException) -> str | None:
    """``module:line`` where npudoctor's own code raised ``error`` (its innermost frame is a
    module of npudoctor, its checks included, other than those standing for the host), else None."""
    tb = error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    if module.split(".")[0] != "npudoctor" or _stands_for_the_host(module):
        return None
    return f"{module}:{tb.tb_lineno}"


def judged(probe: Probe) -> Probe:
    """``probe`` as the live child reports it: a ``fail`` whose evidence includes an exception the
    host caused is ``warn`` (cannot tell), that exception and where it was raised first among its
    evidence, the probe's own summary kept as a note; one whose evidence is an exception npudoctor's
    own code raised is ``ProbeOwnError`` (the check's ``error``). Inside ``watching``."""
    if probe.status is not Status.FAIL:
        return probe
    for error in locations.evidenced:
        where = raised_by_npudoctor(error)
        if where is not None:
            raise ProbeOwnError(
                f"npudoctor's own probe code raised {type(error).__name__}: {_first_line(str(error))} "
                f"at {where}: a defect of npudoctor, not of sglang"
            ) from error
    caused = [(error, host_cause(error)) for error in locations.evidenced]
    error, cause = next(((e, c) for e, c in caused if c is not None), (None, None))
    if cause is None:
        return probe
    text, evidence = _described(error, cause)
    return Probe(
        Status.WARN,
        f"cannot tell: the live probe met {text}",
        (evidence, *probe.evidence),
        (
            *probe.assumptions,
            f"live: the probe's own reading, set aside (the host caused it): {probe.summary}",
        ),
        probe.roles,
        probe.stood_in,
    )
