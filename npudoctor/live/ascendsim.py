"""A simulated Ascend host for the dry run: sglang sees an NPU from import on.

``npusim`` (the probes') keeps ``is_npu()`` False while sglang imports and adds ``torch.npu`` only
around a probe's calls. The dry run starts sglang's real scheduler as an Ascend host would, so
everything here is in place *before* sglang is imported and stays until the interpreter ends (the
dry run has an interpreter of its own per role):

* ``torch.npu``: the device module torch_npu installs, backed by the CPU: one device, streams and
  events of ``torch.cpu``, a bounded device memory (``DEVICE_MEMORY``). Graph capture is not
  simulated: ``NPUGraph`` is a gap (the dry run runs decode eagerly and says so).
* the ``"npu"`` device: torch's PrivateUse1 backend renamed to ``npu`` (as torch_npu does), so
  ``torch.device("npu:0")`` and ``Tensor.npu()`` exist; ``OnHost`` (a ``TorchFunctionMode``, the
  mechanism of ``torch.set_default_device``) puts every tensor sglang asks on ``npu``/``cuda`` on
  the CPU. Pinned memory is plain memory (the CPU build has no pinning for PrivateUse1).
* the Ascend packages (``torch_npu``, ``torchair``, ``sgl_kernel_npu``, and ``triton`` where the
  host has none, as triton-ascend): ``SimulatedPackage`` modules. An attribute is a CPU reference
  where ``npukernels`` (torch_npu ops) or ``KNOWN`` (runtime configuration, kernels) has one,
  a stub class for a configuration object, and otherwise an ``Unmodelled`` value: free to import,
  decorate with and subclass, but *calling* it once sglang runs raises ``SimulationGap``, recorded
  in ``RECORD``: npudoctor lacks the op, never a silent pass.
* ``torch_npu.contrib.transfer_to_npu``: importing it routes ``torch.cuda.*`` to ``torch.npu.*`` as
  the real module does (sglang's ``init_npu_backend`` imports it), so ``torch.cuda`` code works as
  on an Ascend host, while CUDA-only packages (``sgl_kernel``, ``flashinfer``, ...) stay missing and
  fail to import as they would there.
* HCCL: ``torch.distributed`` backend ``hccl`` is gloo over the CPU (a world of one).

On a host where the real torch_npu sees a device, none of this is installed.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.machinery
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from npudoctor.live import standins

# The simulated device's memory: sglang sizes its KV pool from it, so it bounds the dry run's memory.
DEVICE_MEMORY = 8 << 30
DEVICE_NAME = "Ascend910B3"
# Packages an Ascend host has and this one simulates (triton only where the host has none: as
# triton-ascend), with the versions they claim (``__version__`` and their dist-info).
ASCEND_PACKAGES = {
    "torch_npu": torch.__version__.split("+")[0],
    "torchair": "0.1",
    "sgl_kernel_npu": "0.0.0",
    "triton": "3.2.0",
}
TORCHVISION = "0.26.0"
# CUDA-only packages: missing on an Ascend host, so an import of them fails here too (never stood in).
CUDA_ONLY_PACKAGES = frozenset(
    {"sgl_kernel", "flashinfer", "flash_attn", "deep_gemm", "vllm", "cuda", "pynvml", "nvidia", "cutlass"}
)


class SimulationGap(BaseException):
    """sglang called an Ascend op or API the simulation has no CPU reference for.

    A ``BaseException``, so sglang's own ``except Exception`` handlers (the scheduler's crash
    report, a fallback path) cannot swallow it: the dry run ends there and says what is missing."""

    def __init__(self, name: str, detail: str = ""):
        super().__init__(f"no CPU reference for {name}" + (f": {detail}" if detail else ""))
        self.name = name


class Record:
    """What the run asked of the simulated Ascend: ops answered (with counts) and gaps met."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.gaps: collections.Counter[str] = collections.Counter()
        self.running = False  # set once sglang's modules are imported: calls are no longer decorators

    def called(self, name: str) -> None:
        self.ops[name] += 1

    def gap(self, name: str, detail: str = "") -> SimulationGap:
        self.gaps[name] += 1
        return SimulationGap(name, detail)


RECORD = Record()


def _counted(name: str, reference: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        RECORD.called(name)
        return reference(*args, **kwargs)

    call.__name__ = name.rsplit(".", 1)[-1]
    call.__qualname__ = name
    call.__wrapped__ = reference  # type: ignore[attr-defined]
    return call


class _StubMeta(type):
    """Class attributes of a stub class (``ProfilerActivity.NPU``) are further unmodelled values."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _attribute(f"{cls.__module__}.{cls.__name__}.{name}")
        setattr(cls, name, value)
        return value


class _StubClass(metaclass=_StubMeta):
    """A configuration object of an Ascend package (``ProcessGroupHCCL.Options``, torchair's
    ``CompilerConfig``): it takes any arguments and attributes, and reading an attribute nobody set
    gives a further stub (``config.experimental_config.frozen_parameter = True``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.__dict__.update(kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _StubClass()
        setattr(self, name, value)
        return value


class Unmodelled:
    """An attribute of a simulated package with no reference: a namespace while sglang imports
    (decorators, constants, base classes), a ``SimulationGap`` once it runs and calls it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        value = _attribute(f"{self._name}.{attribute}")
        setattr(self, attribute, value)  # one object per name: ``isinstance`` and ``is`` hold
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], (types.FunctionType, type)) and not kwargs:
            return args[0]  # a decorator, applied as a module is imported
        if not RECORD.running or standins.module_code_running():
            return Unmodelled(f"{self._name}()")
        raise RECORD.gap(self._name)

    def __getitem__(self, grid: Any) -> Any:
        """A Triton launch ``kernel[grid](...)``: the kernel has no CPU reference."""
        return Unmodelled(self._name)

    def __iter__(self) -> Any:
        """An unmodelled collection holds nothing while modules import (``"cpu" in
        triton.backends.backends``, torch's ``has_triton`` as torchao imports): without this,
        ``in`` and iteration fall back to ``__getitem__(0, 1, ...)``, which never ends. Iterating
        it once sglang runs is a gap."""
        if RECORD.running and not standins.module_code_running():
            raise RECORD.gap(self._name, "iterated")
        return iter(())

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (_StubClass,)

    def __repr__(self) -> str:
        return f"<unmodelled {self._name}>"


# References of runtime configuration calls: on one simulated device they have nothing to do, and
# that is their documented effect there (each names where it comes from).
def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def _traced_graph(graph_module: Any, example_inputs: Any) -> Any:
    return graph_module.forward


KNOWN: dict[str, Any] = {
    # torch_npu's own monkey patches of torch (torch_npu/__init__.py): nothing to patch on the CPU
    "torch_npu._apply_patches": _no_op,
    "torch_npu._apply_all_patches": _no_op,
    # jit_compile=False selects binary kernels on the device (torch_npu.npu.set_compile_mode)
    "torch_npu.npu.set_compile_mode": _no_op,
    # torchair compiles a torch.compile graph for the NPU: on the simulated NPU the graph runs as
    # traced (torch.compile's backend contract: a callable taking the FX graph and example inputs)
    "torchair.get_npu_backend": lambda *args, **kwargs: _traced_graph,
    # triton-ascend's backends are the NPU's (torch asks whether one serves the CPU: none does)
    "triton.backends.backends": {"npu": None},
    # a kernel defined while sglang runs (a lazy import): launched through its reference or a gap
    "triton.jit": lambda *args, **kwargs: _jit(*args, **kwargs),
    "triton.autotune": lambda *args, **kwargs: _jit(None),
    "triton.heuristics": lambda *args, **kwargs: _jit(None),
    "triton.cdiv": lambda a, b: -(-a // b),
    "triton.next_power_of_2": lambda n: 1 if n <= 1 else 1 << (int(n) - 1).bit_length(),
    # triton-ascend's driver: the target is the NPU, and an Atlas A2 (910B3) has 20 AI cores and 40
    # vector cores (triton-ascend's ``get_device_properties``: num_aicore / num_vectorcore)
    "triton.runtime.driver.active.get_current_target": lambda: types.SimpleNamespace(
        backend="npu", arch=DEVICE_NAME, warp_size=0
    ),
    "triton.runtime.driver.active.utils.get_device_properties": lambda device=0: {
        "multiprocessor_count": 20,
        "num_aicore": 20,
        "num_vectorcore": 40,
        "max_shared_mem": 192 * 1024,
    },
}


class TritonKernel:
    """A ``@triton.jit`` kernel: ``kernel[grid](*args)`` runs its CPU reference
    (``TRITON_REFERENCES``, by the kernel's module and name), or is a gap."""

    def __init__(self, function: Any):
        self.fn = function
        self.name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__name__', '?')}"

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            reference = _triton_reference(self.name)
            if reference is None:
                raise RECORD.gap(f"Triton kernel {self.name}")
            RECORD.called(f"triton:{self.name}")
            return reference(grid, *args, **kwargs)

        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RECORD.gap(f"Triton kernel {self.name}", "called without a grid")


def _jit(function: Any = None, **options: Any) -> Any:
    """``triton.jit`` / ``triton.autotune(...)`` / ``triton.heuristics(...)``: a kernel, with or
    without decorator arguments."""
    if function is None or not callable(function):
        return lambda fn: fn if isinstance(fn, TritonKernel) else TritonKernel(fn)
    return function if isinstance(function, TritonKernel) else TritonKernel(function)


def _triton_reference(name: str) -> Callable[..., Any] | None:
    """The reference of the kernel ``name`` (module and function); one of sglang's own kernels is
    found under the name it has in any release (kernels move between modules: 0.5.13's
    ``srt/mem_cache/triton_ops/common.py`` is 0.5.23's ``kernels/ops/memory/common.py``)."""
    references = _triton_references()
    if name in references or not name.startswith("sglang."):
        return references.get(name)
    function = name.rsplit(".", 1)[-1]
    moved = [
        ref
        for key, ref in references.items()
        if key.startswith("sglang.") and key.rsplit(".", 1)[-1] == function
    ]
    return moved[0] if len(set(map(id, moved))) == 1 else None


def _triton_references() -> dict[str, Callable[..., Any]]:
    from npudoctor.live.tritonkernels import TRITON_KERNELS

    return TRITON_KERNELS


def leaked(error: BaseException) -> bool:
    """``error`` came from a value of the simulation that sglang used as a real one (an unmodelled
    call's result handed to ``getattr``): the simulation's gap, not sglang's defect."""
    return "Unmodelled" in str(error) or "unmodelled " in str(error)


@functools.cache  # the tables are fixed: built once, not on every attribute a package is asked for
def _kernel_references() -> dict[str, Callable[..., Any]]:
    """torch_npu ops (also as ``torch.ops.npu``) and sgl-kernel-npu functions, by dotted name."""
    from npudoctor.live.npukernels import KERNELS, SGL_KERNEL_NPU

    references = {f"torch_npu.{name}": kernel for name, kernel in KERNELS.items()}
    references.update(SGL_KERNEL_NPU)
    ops = {
        name.removeprefix("torch_npu."): kernel
        for name, kernel in references.items()
        if name.startswith("torch_npu.")
    }
    references.update({f"torch.ops.npu.{name}": kernel for name, kernel in ops.items()})
    return references


def _attribute(name: str) -> Any:
    if name in _triton_references():  # a package's Triton kernel (sgl-kernel-npu's), launched by grid
        kernel = TritonKernel(None)
        kernel.name = name
        return kernel
    known = KNOWN.get(name)
    if known is not None:
        return known  # configuration and decorators: not an op, not counted
    known = _kernel_references().get(name)
    if known is not None:
        return _counted(name, known)
    last = name.rsplit(".", 1)[-1]
    if last[:1].isupper():
        return _StubMeta(last, (_StubClass,), {"__module__": name.rsplit(".", 1)[0]})
    module = sys.modules.get(name)
    return module if module is not None else Unmodelled(name)


class SimulatedPackage(types.ModuleType):
    """A module of a simulated Ascend package (see the module docstring)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__: list[str] = []
        # a path where no file is: torch's compiler reads every loaded module's ``__file__`` as a str
        self.__file__ = f"<simulated by npudoctor>/{name.replace('.', '/')}/__init__.py"
        self.__spec__ = importlib.machinery.ModuleSpec(name, _Finder(), is_package=True)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        value = _attribute(f"{self.__name__}.{attribute}")
        setattr(self, attribute, value)
        return value


class _Finder:
    """Imports of the simulated packages' submodules (``torch_npu.contrib.transfer_to_npu``)."""

    roots: tuple[str, ...] = ()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return SimulatedPackage(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "torch_npu.contrib.transfer_to_npu":
            _transfer_to_npu()


class _CudaOnlyBlocker:
    """``import sgl_kernel`` and the other CUDA-only packages fail here as on an Ascend host, where
    this host has them installed (where it has not, the import fails by itself and the stand-ins
    leave it so). A probe of availability (``importlib.util.find_spec``, as transformers asks for
    ``flash_attn``) finds them and only the import fails: an Ascend image may hold the package while
    its CUDA library cannot load."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in CUDA_ONLY_PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: Any) -> None:
        raise ModuleNotFoundError(
            f"No module named {spec.name!r} (CUDA-only: it does not load on an Ascend host)", name=spec.name
        )

    def exec_module(self, module: types.ModuleType) -> None:  # never reached: create_module raised
        raise ModuleNotFoundError(module.__name__)


# ----- torch.npu -----------------------------------------------------------------------------------
class _NpuModule(types.ModuleType):
    """``torch.npu`` on one simulated device; a name torch_npu has and this lacks is a gap."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name[:1].isupper():
            return Unmodelled(f"torch.npu.{name}")
        return Unmodelled(f"torch.npu.{name}")


def _device_module() -> types.ModuleType:
    npu = _NpuModule("torch.npu")
    properties = types.SimpleNamespace(name=DEVICE_NAME, total_memory=DEVICE_MEMORY, major=9, minor=0)
    zero = lambda device=None: 0  # noqa: E731
    npu.__dict__.update(
        is_available=lambda: True,
        is_initialized=lambda: True,
        _lazy_init=lambda: None,  # the device runtime's first-use init: the simulated one is up
        device_count=lambda: 1,
        current_device=lambda: 0,
        set_device=lambda device: None,
        synchronize=lambda device=None: None,
        empty_cache=lambda: None,
        mem_get_info=lambda device=None: (DEVICE_MEMORY, DEVICE_MEMORY),
        memory_allocated=zero,
        max_memory_allocated=zero,
        memory_reserved=zero,
        max_memory_reserved=zero,
        reset_peak_memory_stats=lambda device=None: None,
        get_device_name=lambda device=None: DEVICE_NAME,
        get_device_properties=lambda device=None: properties,
        get_device_capability=lambda device=None: (9, 0),
        # torch.manual_seed seeds the device through these: the CPU generator it seeds is the device's
        manual_seed=lambda seed: None,
        manual_seed_all=lambda seed: None,
        _is_in_bad_fork=lambda: False,
        config=types.SimpleNamespace(allow_internal_format=False),
    )
    return npu


def _transfer_to_npu() -> None:
    """What ``torch_npu.contrib.transfer_to_npu`` does on import: ``torch.cuda``'s API routed to
    ``torch.npu`` (and ``is_available`` True, which sglang re-mocks to False after the import)."""
    for name in (
        "is_available",
        "device_count",
        "current_device",
        "set_device",
        "synchronize",
        "empty_cache",
        "mem_get_info",
        "memory_allocated",
        "max_memory_allocated",
        "reset_peak_memory_stats",
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "Stream",
        "Event",
        "current_stream",
        "default_stream",
        "stream",
        "manual_seed",
        "manual_seed_all",
    ):
        setattr(torch.cuda, name, getattr(torch.npu, name))


_HOST_KINDS = ("cuda", "npu", "privateuseone")


def _host(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int):
        return "cpu"
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return "cpu" if kind in _HOST_KINDS else device


class OnHost(TorchFunctionMode):
    """Every tensor sglang puts on the NPU (or on ``cuda``, routed there) lands on the CPU."""

    def __torch_function__(self, func: Any, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("npu", "cuda", "pin_memory"):
            return args[0]
        if name == "is_pinned":
            return False
        kwargs.pop("pin_memory", None)
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        if name == "to" and len(args) > 1 and isinstance(args[1], (str, torch.device, int)):
            args = (args[0], _host(args[1]), *args[2:])
        return func(*args, **kwargs)


def _register_npu_accelerator() -> None:
    """torch_npu registers its PrivateUse1 hooks in C++, which makes the NPU torch's current
    accelerator: ``torch.get_device_module()`` (no device) is ``torch.npu``, as sglang 0.5.12's
    ``parallel_state`` asks at import. The simulated device registers the Python hooks torch
    provides for a backend written in Python (``torch.utils.backend_registration``)."""

    class NpuHooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return True

        def has_primary_context(self, dev_id: int) -> bool:
            return True

        def is_built(self) -> bool:
            return True

    class NpuDeviceGuard(torch._C._acc.DeviceGuard):
        def type_(self) -> Any:
            return torch._C._autograd.DeviceType.PrivateUse1

    torch._C._acc.register_python_privateuseone_hook(NpuHooks())
    torch._C._acc.register_python_privateuseone_device_guard(NpuDeviceGuard())


def _hccl_on_gloo() -> None:
    import torch.distributed as dist

    def make(store: Any, rank: int, size: int, timeout: Any) -> Any:
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    with contextlib.suppress(ValueError, RuntimeError):  # registered already
        dist.Backend.register_backend("hccl", make, devices=["cpu", "npu"])


def install() -> list[str]:
    """Make this interpreter an Ascend host with one simulated NPU, before sglang is imported.
    Returns the packages simulated. Nothing is put back: the dry run's interpreter is its own."""
    from npudoctor.live import npusim

    if npusim.real_npu_available():
        return []
    simulated = [name for name in ASCEND_PACKAGES if name != "triton" or _missing("triton")]
    _Finder.roots = tuple(simulated)
    metadata = Path(tempfile.mkdtemp(prefix="npudoctor-ascend-"))  # in the run's scratch (TMPDIR)
    for name in simulated:
        sys.modules[name] = SimulatedPackage(name)
        sys.modules[name].__version__ = ASCEND_PACKAGES[name]
        info = metadata / f"{name}-{ASCEND_PACKAGES[name]}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {ASCEND_PACKAGES[name]}\n"
        )
    # torchvision, where the host has none: transformers' image processors ask for it at import
    # (sglang's config modules import them); the mock of the probes' simulation, as there
    if _missing("torchvision"):
        sys.modules["torchvision"] = npusim.MockModule("torchvision")
        sys.modules["torchvision"].__version__ = TORCHVISION
        sys.meta_path.append(npusim._MockFinder({"torchvision"}))
        info = metadata / f"torchvision-{TORCHVISION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {TORCHVISION}\n")
        simulated.append("torchvision")
    sys.path.append(str(metadata))
    sys.meta_path.insert(0, _Finder())
    if any(not _missing(name) for name in CUDA_ONLY_PACKAGES):
        sys.meta_path.insert(0, _CudaOnlyBlocker())
    torch.utils.rename_privateuse1_backend("npu")
    torch.utils.generate_methods_for_privateuse1_backend()
    _register_npu_accelerator()
    torch.npu = _device_module()  # type: ignore[attr-defined]
    # importable too, as torch_npu's ``torch.npu`` is (dynamo imports the device module by name when
    # it traces sglang's ``torch.compile``d functions: 0.5.4's ``FutureMap.resolve_future``)
    sys.modules["torch.npu"] = torch.npu
    torch.ops.npu = SimulatedPackage("torch.ops.npu")  # type: ignore[attr-defined]
    _hccl_on_gloo()
    OnHost().__enter__()  # for the interpreter's life (the dry run's own)
    _threads_on_host()
    return simulated


def _threads_on_host() -> None:
    """A torch function mode holds for the thread that entered it: the threads sglang starts (the
    overlap worker of older releases, a watchdog) run under their own ``OnHost``."""
    run = threading.Thread.run

    def on_host(self: threading.Thread) -> None:
        with OnHost():
            run(self)

    threading.Thread.run = on_host  # type: ignore[method-assign]


def _missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None
