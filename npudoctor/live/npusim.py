"""A small, explicit NPU simulation for running sglang's Ascend code on a CPU host.

The live depth imports the real sglang modules and calls the real methods. On a host
without a working torch_npu (CI, a laptop) three things stand in, and only for the
duration of a live run (``simulated_npu()`` restores ``sys.modules`` and ``torch``):

* ``torch_npu``: a bare module, so ``import torch_npu`` in sglang's NPU files succeeds
  (0.5.8-0.5.11 import it unconditionally). It adds nothing to ``torch`` at import
  time: sglang's ``is_npu()`` is ``hasattr(torch, "npu")`` and must stay False while
  modules import, or sglang would take import-time NPU branches we do not test.
* ``triton``, ``sgl_kernel_npu`` (Ascend kernel package, imported at the top of
  ``ascend_backend.py``) and ``torchvision``, each only when the host cannot import it:
  mock modules whose attributes are further mocks and whose calls are pass-through
  decorators, the approach of sglang 0.5.23's own ``_platform_stubs.py``. The probed
  code never runs a Triton or sgl_kernel_npu kernel.
* ``torch.npu``: installed by ``npu_runtime()`` around the probe calls only, with the
  few functions the probed paths touch (synchronize, streams, device queries), all no-ops
  on CPU. The NPU kernels the probed code calls (``torch_npu.X`` and ``torch.ops.npu.X``)
  are the CPU references of ``npudoctor.live.npukernels``, also only around the calls.

On a host where the real torch_npu imports and sees a device, nothing is simulated.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

STANDIN_MARK = "__npudoctor_standin__"
# Packages stood in for when the host cannot import them, with the version they claim.
_STANDIN_VERSIONS = {"triton": "3.0.0", "torchvision": "0.26.0", "sgl_kernel_npu": "0.0.0"}


def real_npu_available() -> bool:
    """True only where the real torch_npu imports and reports a device."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception:
        return False


class _StubMeta(type):
    """Class-level attributes of a stub class (``InterpolationMode.BICUBIC``) are mocks too."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return MockModule(f"{cls.__module__}.{cls.__name__}.{name}")


class _StubBase(metaclass=_StubMeta):
    """Any mock attribute that looks like a class is this, so sglang can subclass it."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass


class MockModule(types.ModuleType):
    """A module whose every attribute is a further mock and whose calls decorate transparently."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        setattr(self, STANDIN_MARK, True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value: Any = _StubMeta(name, (_StubBase,), {"__module__": self.__name__})
        else:
            value = MockModule(f"{self.__name__}.{name}")
            sys.modules[value.__name__] = value
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn


class _MockFinder:
    """Resolves ``import triton.language`` etc. to mocks while a stand-in package is active."""

    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return sys.modules.get(spec.name) or MockModule(spec.name)

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = module


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def simulated_npu() -> Iterator[list[str]]:
    """Stand-ins for torch_npu / triton / torchvision while sglang is imported and probed.

    Yields the names stood in for. Everything added to ``sys.modules`` during the block
    (sglang included) is removed afterwards, and ``sys.meta_path`` is restored.
    """
    if real_npu_available():
        yield []
        return
    before = dict(sys.modules)
    meta_path = list(sys.meta_path)
    path = list(sys.path)
    mocked = {name for name in _STANDIN_VERSIONS if not _importable(name)}
    metadata_dir = tempfile.TemporaryDirectory(prefix="npudoctor-standins-")
    for name in mocked:
        sys.modules[name] = MockModule(name)
        sys.modules[name].__version__ = _STANDIN_VERSIONS[name]
        # transformers asks importlib.metadata whether torchvision exists and which version
        info = Path(metadata_dir.name, f"{name}-{_STANDIN_VERSIONS[name]}.dist-info")
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {_STANDIN_VERSIONS[name]}\n"
        )
    sys.path.append(metadata_dir.name)
    torch_npu = types.ModuleType("torch_npu")
    setattr(torch_npu, STANDIN_MARK, True)
    torch_npu.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    sys.modules["torch_npu"] = torch_npu
    sys.meta_path.insert(0, _MockFinder(mocked))
    try:
        yield sorted(mocked | {"torch_npu"})
    finally:
        sys.meta_path[:] = meta_path
        sys.path[:] = path
        metadata_dir.cleanup()
        for name in list(sys.modules):
            if name not in before:
                del sys.modules[name]
        sys.modules.update(before)


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return _Event()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class _Event(_Stream):
    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


def _npu_namespace() -> types.SimpleNamespace:
    current = _Stream()
    return types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: 0,
        set_device=lambda device: None,
        synchronize=lambda device=None: None,
        empty_cache=lambda: None,
        Stream=_Stream,
        Event=_Event,
        current_stream=lambda device=None: current,
        default_stream=lambda device=None: current,
        stream=lambda stream=None: contextlib.nullcontext(),
        mem_get_info=lambda device=None: (64 << 30, 64 << 30),
    )


@contextlib.contextmanager
def npu_runtime() -> Iterator[None]:
    """``torch.npu`` (no-op streams and syncs), a no-op ``torch.cuda.synchronize`` and the CPU
    reference kernels (on the stand-in ``torch_npu`` and as ``torch.ops.npu``) for the probe calls.

    Only around calls, never around imports (see the module docstring). Restored afterwards.
    """
    if real_npu_available():
        yield
        return
    from npudoctor.live.npukernels import KERNELS

    had_npu = hasattr(torch, "npu")
    previous_npu = getattr(torch, "npu", None)
    previous_cuda_sync = torch.cuda.synchronize
    previous_ops_npu = torch.ops.__dict__.get("npu")
    standin = sys.modules.get("torch_npu")
    if standin is not None and not getattr(standin, STANDIN_MARK, False):
        standin = None  # a real (if deviceless) torch_npu keeps its own kernels
    torch.npu = _npu_namespace()  # type: ignore[attr-defined]
    torch.cuda.synchronize = lambda device=None: None  # inherited base offload methods call it
    torch.ops.npu = types.SimpleNamespace(**KERNELS)
    if standin is not None:
        for name, kernel in KERNELS.items():
            setattr(standin, name, kernel)
    try:
        yield
    finally:
        if standin is not None:
            for name in KERNELS:
                standin.__dict__.pop(name, None)
        if previous_ops_npu is None:
            del torch.ops.npu
        else:
            torch.ops.npu = previous_ops_npu
        torch.cuda.synchronize = previous_cuda_sync
        if had_npu:
            torch.npu = previous_npu  # type: ignore[attr-defined]
        else:
            del torch.npu  # type: ignore[attr-defined]
