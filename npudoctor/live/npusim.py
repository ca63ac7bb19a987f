"""A small, explicit NPU simulation for running sglang's Ascend code on a CPU host.

The live depth imports the real sglang modules and calls the real methods. On a host
without a working torch_npu (CI, a laptop) these stand in, and only for the
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
* the device names sglang's shared code uses (``"cuda"``, ``"npu"``): ``accelerator_on_cpu()``
  maps them to the CPU around the probe calls, as ``torch_npu.contrib.transfer_to_npu`` maps
  ``"cuda"`` to the NPU on an Ascend host.

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
from collections.abc import Callable, Iterator
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


_FACTORIES = ("tensor", "as_tensor", "empty", "zeros", "ones", "full", "arange")


def _host(device: Any) -> Any:
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return "cpu" if kind in ("cuda", "npu") else device


@contextlib.contextmanager
def accelerator_on_cpu() -> Iterator[None]:
    """Tensors sglang puts on ``"cuda"``/``"npu"`` land on the CPU.

    On Ascend, sglang's ``init_npu_backend`` imports ``torch_npu.contrib.transfer_to_npu``
    (``hardware_backend/npu/utils.py``), which maps the CUDA device sglang's shared code
    names (``device="cuda"`` in cp_utils) to the NPU. On this host the simulated NPU is the
    CPU, so the same mapping goes to ``cpu``. Restored afterwards.
    """
    saved = {name: getattr(torch, name) for name in _FACTORIES}
    saved_to = torch.Tensor.__dict__.get("to")
    saved_cuda = torch.Tensor.__dict__.get("cuda")

    def factory(original: Callable[..., Any]) -> Callable[..., Any]:
        def on_host(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("device") is not None:
                kwargs["device"] = _host(kwargs["device"])
            return original(*args, **kwargs)

        return on_host

    tensor_to = torch._C.TensorBase.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args and isinstance(args[0], (str, torch.device)):
            args = (_host(args[0]), *args[1:])
        if kwargs.get("device") is not None:
            kwargs["device"] = _host(kwargs["device"])
        return tensor_to(self, *args, **kwargs)

    for name, original in saved.items():
        setattr(torch, name, factory(original))
    torch.Tensor.to = to  # type: ignore[method-assign]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(torch, name, original)
        for name, value in (("to", saved_to), ("cuda", saved_cuda)):
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)


# ----- collectives across ranks run one after another in this process ------------------------------
class Collectives:
    """The collectives of one process group (e.g. the attention-CP group), for a live probe that runs
    every rank of the group in this process, one rank after the other.

    Ranks run in turn, so a rank's all-gather cannot wait for its peers' tensors. The probe runs the
    ranks in passes instead: in each pass, rank ``r``'s ``i``-th all-gather records the tensor ``r``
    sends and returns the concatenation (along dim 0) of every rank's ``i``-th tensor of the pass
    before (its own of this pass in its slot; a peer with none yet stands in with ``r``'s own, and
    the pass is then provisional). When a pass sent exactly what the pass before did and nothing in it
    was provisional (``settled``), that pass is what the ranks would have computed together: every
    gather returned what the real collective returns. Code whose inputs to a gather depend on an
    earlier gather settles after one more pass; a pass with no gather at all is settled as it is."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.passes = 0
        self._before: dict[int, list[torch.Tensor]] = {}
        self._sent: dict[int, list[torch.Tensor]] = {}
        self._provisional = False

    def begin_pass(self) -> None:
        self._before, self._sent = self._sent, {rank: [] for rank in range(self.world_size)}
        self._provisional = False
        self.passes += 1

    def begin_rank(self, rank: int) -> None:
        """``rank`` runs (again) in this pass: what it sent before in this pass is forgotten."""
        self._sent[rank] = []

    def settled(self) -> bool:
        """This pass's gathers all returned what every rank sent in this pass."""
        if not any(self._sent.values()):
            return True
        if self._provisional:
            return False
        return all(
            len(self._before.get(rank, [])) == len(sent)
            and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(self._before[rank], sent))
            for rank, sent in self._sent.items()
        )

    def group(self, rank: int) -> SimulatedGroup:
        return SimulatedGroup(self, rank)

    def all_gather(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor of this call, concatenated along dim 0 (see the class docstring)."""
        index = len(self._sent[rank])
        self._sent[rank].append(tensor.detach().clone())
        pieces = []
        for peer in range(self.world_size):
            before = self._before.get(peer, [])
            if peer == rank:
                pieces.append(tensor)
            elif index < len(before) and before[index].shape == tensor.shape:
                pieces.append(before[index].to(tensor.dtype))
            else:
                self._provisional = True
                pieces.append(tensor)
        return torch.cat(pieces, dim=0)


class SimulatedGroup:
    """One rank's view of a ``Collectives`` group, with the methods of sglang's ``GroupCoordinator``
    that the probed paths call for an all-gather. Any other collective raises
    ``NotImplementedError`` naming it: a probe never passes on a collective this does not model."""

    def __init__(self, collectives: Collectives, rank: int):
        self._collectives = collectives
        self.rank_in_group = rank
        self.rank = rank
        self.local_rank = rank
        self.world_size = collectives.world_size
        self.ranks = list(range(collectives.world_size))
        self.pynccl_comm = None
        self.device_group = None
        self.cpu_group = None

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
        gathered = self._collectives.all_gather(self.rank, input)
        if output.numel() != gathered.numel():
            raise ValueError(
                f"all_gather_into_tensor: output of shape {tuple(output.shape)} for {self.world_size} "
                f"ranks x input of shape {tuple(input.shape)}"
            )
        output.copy_(gathered.reshape(output.shape))

    def cp_all_gather_into_tensor_async(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        stream: Any = None,
    ) -> None:
        self.all_gather_into_tensor(output, input)

    def all_gather(
        self, input_: torch.Tensor, dim: int = -1, output_tensor_list: list[torch.Tensor] | None = None
    ) -> torch.Tensor | None:
        gathered = self._collectives.all_gather(self.rank, input_.unsqueeze(0))
        if output_tensor_list is not None:
            for target, piece in zip(output_tensor_list, gathered):
                target.copy_(piece)
            return None
        return torch.cat(list(gathered), dim=dim)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(f"simulated process group: {name} is not modelled")


@contextlib.contextmanager
def npu_only_imports_bound(prefix: str = "sglang") -> Iterator[list[str]]:
    """``torch_npu`` bound in the loaded modules under ``prefix`` that import it only on an NPU
    (``if is_npu(): import torch_npu``, sglang's memory_pool_npu.py since 0.5.13) and so lack it
    here: on Ascend that import runs when the module is imported, while in the simulation
    ``is_npu()`` is False at import time (see the module docstring). Bound to the ``torch_npu`` the
    process has (the stand-in, carrying the CPU kernels inside ``npu_runtime()``) for the block
    only; yields the modules bound. Nothing is done where torch_npu is the real one."""
    standin = sys.modules.get("torch_npu")
    if standin is None or not getattr(standin, STANDIN_MARK, False):
        yield []
        return
    bound = [
        module
        for name, module in list(sys.modules.items())
        if (name == prefix or name.startswith(prefix + "."))
        and module is not None
        and "torch_npu" not in vars(module)
        and _imports_torch_npu(getattr(module, "__file__", None))
    ]
    for module in bound:
        module.torch_npu = standin
    try:
        yield [module.__name__ for module in bound]
    finally:
        for module in bound:
            vars(module).pop("torch_npu", None)


_IMPORTS_TORCH_NPU: dict[str, bool] = {}


def _imports_torch_npu(path: str | None) -> bool:
    if not path or not path.endswith(".py"):
        return False
    if path not in _IMPORTS_TORCH_NPU:
        try:
            _IMPORTS_TORCH_NPU[path] = b"import torch_npu" in Path(path).read_bytes()
        except OSError:
            _IMPORTS_TORCH_NPU[path] = False
    return _IMPORTS_TORCH_NPU[path]
