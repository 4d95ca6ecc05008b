"""Loading the cache onto a device and launching its kernels (no JIT at serving time).

``load()`` reads the manifest for the current device's arch, checks every entry
against the contract (manifest.py: ``check_against_contract``; the ops pack arguments
and compute grids from it), checks every cubin on the CPU side (path, size, sha256,
the ELF header's SM, its section table and attribute lists, and from the kernel's own
list the symbol, the parameter count and the block shape), loads it
with ``cuLibraryLoadData`` (a library is context-independent, so every GPU of the
process can use it) and checks it against the device: the symbol again by
``cuLibraryGetKernel``, the parameter layout by ``cuFuncGetParamInfo``, shared
memory against the opt-in limit, the cluster shape by ``cuOccupancyMaxActiveClusters``. The full ELF parse
(every kernel's parameter list) is left to ``check_cache`` and ``python -m runtime
verify``: at load it would repeat what the driver checks. A launch is one
``cuLaunchKernelEx`` on the current torch stream with arguments packed into one
buffer prepared at load time (one ``struct.pack_into``, which range-checks each).

``SPARSE_DECODE_AOT_LOAD_PROFILE=1`` makes ``load()`` time its phases (summed over
kernels), print them to stderr as one JSON line and keep them in
``KernelCache.load_profile``.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from pathlib import Path

import torch

from .arguments import cuda_device_index, whole_number
from .contract import ARCH_CAPABILITY, all_variants
from .driver import CudaCallError, check, driver, missing_function_error
from .errors import (
    CacheError,
    CacheLoadInterrupted,
    ClusterShapeError,
    DeviceArchError,
    DriverRefusedError,
    NoDriverError,
    SharedMemoryError,
    SymbolError,
    UnknownKernelError,
    rebuild,
    warn_at_caller,
)
from .manifest import (
    KernelEntry,
    Manifest,
    build_settled,
    check_against_contract,
    check_param_layout,
    no_tick,
    read_checked_cubin,
    read_manifest,
    resolved_root,
)

PROFILE_ENV = "SPARSE_DECODE_AOT_LOAD_PROFILE"

# Each contract C type as a struct format character (native size and alignment).
_FORMATS = {"void*": "Q", "int32_t": "i", "uint32_t": "I", "float": "f", "int64_t": "q"}
# A tensor among a launch's arguments: struct packs a one-element one as its value (its __index__), which for a
# pointer launched the kernel at address 5, say (an illegal address: the context unusable), and for a number read a
# device tensor back. The host ops pass ints and floats: one C-level pass over the arguments' types (about 0.1-0.3 us
# of a launch) sees that; anything else is looked at for a tensor, a subclass's included.
_NUMBER_TYPES = frozenset({int, float})


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` switches its option on: set, non-empty and not "0"."""
    return os.environ.get(name, "") not in ("", "0")


def arch_for_capability(capability: tuple[int, int]) -> str | None:
    for arch, cc in ARCH_CAPABILITY.items():
        if tuple(capability) == cc:
            return arch
    return None


class Kernel:
    """One loaded kernel: its manifest entry and a prepared launch."""

    def __init__(self, entry: KernelEntry, cu_kernel, max_active_clusters: int, config, device: int | None = None):
        drv = driver()
        self.entry = entry
        # The device it was loaded and configured for (its shared-memory and cluster attributes are that
        # device's): launch_on refuses it on another. None: not tied to one (stand-ins in tests).
        self.device = device
        self.name = entry.name
        self.max_active_clusters = max_active_clusters
        # The CUkernel, not a context's CUfunction: launches work from any context.
        self._function = cu_kernel
        self._launch = drv.cuLaunchKernelEx
        self._no_context = drv.CUresult.CUDA_ERROR_INVALID_CONTEXT
        # Argument storage and the void* array pointing into it, built once; a launch
        # only writes values (the driver copies them, so graph capture is safe).
        self._pack, self._arguments, self._pointers = _argument_block(entry.params)
        self._params_address = ctypes.addressof(self._pointers)
        # The config the loader built for the occupancy query (grid = one cluster); the first
        # launch sets the grid, since _dims starts as None.
        self._config = config
        self._cluster_x = entry.cluster[0]
        self._dims = None
        self._stream = None
        self._lock = threading.Lock()
        self._plain = None  # in_stream_order()'s kernel

    @staticmethod
    def _make_config(drv, entry: KernelEntry, attributes: _LaunchAttributes):
        """The kernel's CUlaunchConfig: block, dynamic shared memory, cluster and PDL attributes.

        ``attributes`` shares the attribute structs across the kernels of one load (assigning
        ``config.attrs`` copies them into the config).
        """
        config = drv.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = entry.threads, 1, 1
        config.sharedMemBytes = entry.smem_bytes
        attrs = []
        if entry.cluster_size > 1:
            attrs.append(attributes.cluster(entry.cluster))
        if entry.pdl:
            attrs.append(attributes.pdl())
        if attrs:
            config.attrs = attrs
        config.numAttrs = len(attrs)
        return config

    @property
    def variant_config(self) -> dict:
        return self.entry.config

    def in_stream_order(self) -> "Kernel":
        """This kernel without programmatic dependent launch: each launch starts only after the
        previous work on its stream has finished (to time it apart from the launch before it, or
        behind a kernel that does not trigger its dependents early). Same function, its own launch
        config; built once."""
        if not self.entry.pdl:
            return self
        if self._plain is not None:  # the per-launch path (decode_topk(pdl=False)): no lock
            return self._plain
        with self._lock:
            if self._plain is None:
                drv = driver()
                entry = self.entry._replace(pdl=False)
                config = Kernel._make_config(drv, entry, _LaunchAttributes(drv))
                self._plain = Kernel(entry, self._function, self.max_active_clusters, config, self.device)
            return self._plain

    def launch(self, grid, *args, stream=None) -> None:
        """Launch on ``stream`` (default: torch's current stream) with ``args`` in contract order.

        The stream must be on the device the kernel was loaded for (a torch stream or the default one of
        another device is refused, and so is any default stream, torch's included, while another device is
        current; ``launch_on`` makes the tensors' device current around the launch).

        ``grid`` counts CTAs (an int or an (x, y, z) tuple); x must be a multiple of the
        cluster's x. Pointers are ints (``tensor.data_ptr()``). The arguments are packed into
        their contract C types by one ``struct.pack_into``, which refuses a value its type
        cannot hold (an int past int32, a negative pointer) and a wrong count: a ``ValueError``
        or ``TypeError`` naming the argument, before the launch. A float past float32's range
        packs as inf, as C's conversion does (the ops check their scales before).
        """
        if type(grid) is int:
            dims = (grid, 1, 1)
        elif isinstance(grid, (tuple, list)):
            dims = tuple(grid)
            if not all(type(d) is int for d in dims):  # (2.0, 1, 1) equals (2, 1, 1): refused before that test
                dims = self._check_grid(dims)
        else:
            dims = (whole_number(f"{self.name}: grid", grid), 1, 1)
        # This kernel's shared-memory and cluster attributes were set for its own device: refuse another GPU's
        # stream, as launch_on does. A raw handle cannot say its device; a torch stream and the default can.
        if stream is None:
            current = _current_device()
            if current != self.device and self.device is not None:  # the one comparison when they match
                raise self._other_device(f"torch's current device is cuda:{current}")
            stream = _raw_stream_of(current)
        else:
            if type(stream) is not int:
                index = getattr(stream, "device_index", None)
                if self.device is not None and index is not None and index != self.device:
                    raise self._other_device(f"stream is on cuda:{index}")
                try:
                    stream = stream.cuda_stream
                except AttributeError:  # a torch.Stream of torch.accelerator, a string: no CUDA handle to launch on
                    raise self._refused_stream(stream) from None
            # 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) name a default stream of the current context, not
            # of a device: a raw handle or a torch stream's (torch's default stream of any device has the handle 0)
            if 0 <= stream <= _PER_THREAD_STREAM and self.device is not None and _current_device() != self.device:
                raise self._other_device(f"stream handle {stream} names the default stream of the current device, "
                                         f"cuda:{_current_device()}")
        with self._lock:
            config = self._config
            if dims != self._dims:
                self._set_grid(dims)
            if stream != self._stream:
                try:
                    config.hStream = stream
                except (OverflowError, TypeError, ValueError):  # a negative handle, one past 64 bits, a float
                    raise self._refused_stream(stream) from None
                self._stream = stream
            if not _NUMBER_TYPES.issuperset(map(type, args)) and any(isinstance(a, torch.Tensor) for a in args):
                raise self._refused_arguments(args)
            try:  # struct checks the count and each value's range and type, in C, in one call
                self._pack(self._arguments, 0, *args)
            except (struct.error, OverflowError, TypeError):
                raise self._refused_arguments(args) from None
            (err,) = self._launch(config, self._function, self._params_address, 0)
            if err:  # the launch path's one test of the result
                self._failed_launch(err, config, grid)

    def _failed_launch(self, err, config, grid) -> None:
        """Raise the driver's refusal of a launch, or, where no context was current, launch again once with one.

        A thread whose first CUDA work is this launch has no context current (torch binds one at its first runtime
        call, which an op given every buffer need not make), and a CUkernel launched on the default stream runs in
        the current context: bind the device's primary context, as torch does. (Called under the kernel's lock.)"""
        if err == self._no_context:
            _make_primary_context_current(_current_device() if self.device is None else self.device)
            (err,) = self._launch(config, self._function, self._params_address, 0)
        if err:
            try:
                check((err,), f"cuLaunchKernelEx({self.name}, grid={grid})")
            except CudaCallError as e:
                if getattr(err, "name", "") not in _STICKY_ERRORS:
                    raise
                # A launch is asynchronous: a sticky error is an earlier kernel's fault, which this call only reports.
                raise CudaCallError(f"{e}: an earlier error left this CUDA context unusable (a sticky error: an earlier "
                                    f"kernel's fault, not {self.name}'s unless CUDA_LAUNCH_BLOCKING=1, or a destroyed "
                                    f"context); restart the process and find the faulting kernel with "
                                    f"compute-sanitizer", err) from None

    def _refused_arguments(self, args) -> Exception:
        """The error for arguments struct would not pack: the count, or the first value its C type cannot hold.
        (The buffer may hold some of them: every launch packs all its arguments before it uses any.)"""
        params = self.entry.params
        if len(args) != len(params):
            return TypeError(f"{self.name}: takes {len(params)} arguments ({', '.join(p.name for p in params)}), "
                             f"got {len(args)}")
        for param, value in zip(params, args):
            code = _FORMATS[param.ctype]
            if isinstance(value, torch.Tensor):  # whatever its size (launch says why); its data_ptr() was meant
                # No repr, no value read: a device tensor's waits for the GPU (and fails inside a capture)
                fix = f"{param.name}.data_ptr()" if code == "Q" else f"a Python {'float' if code == 'f' else 'int'}"
                return TypeError(f"{self.name}: argument {param.name} ({param.ctype}) got a "
                                 f"{type(value).__name__} of shape {tuple(value.shape)} on {value.device}; "
                                 f"pass {fix}")
            try:
                struct.pack(code, value)
            except (struct.error, OverflowError, TypeError):
                number = (float, int) if code == "f" else int
                if not isinstance(value, number) and not hasattr(value, "__index__"):
                    return TypeError(f"{self.name}: argument {param.name} ({param.ctype}) got {type(value).__name__} "
                                     f"{value!r}; pass {'a number' if code == 'f' else 'an int'}")
                return ValueError(f"{self.name}: argument {param.name} ({param.ctype}) = {value!r} is out of its C "
                                  f"type's range {_RANGES[code]}; check the value before the launch")
        return TypeError(f"{self.name}: arguments {args!r} could not be packed as "
                         f"({', '.join(f'{p.ctype} {p.name}' for p in params)})")

    def _refused_stream(self, stream) -> Exception:
        """The error for a stream the launch cannot take: no CUDA stream, or a handle no CUstream holds."""
        shown = f"{stream!r}" if type(stream) in (int, float) else type(stream).__name__
        error = ValueError if type(stream) is int else TypeError
        return error(f"{self.name}: stream must be a torch.cuda.Stream, a CUstream handle (an int from 0 to 2**64 - 1) "
                     f"or None, got {shown}; pass torch.cuda.current_stream(), its cuda_stream, or None")

    def _other_device(self, where: str) -> ValueError:
        return ValueError(f"{self.name}: {where}, the kernel was loaded for cuda:{self.device}; launch it on its "
                          f"device's stream (launch_on, or torch.cuda.device({self.device}) around the launch) or "
                          f"load the cache there (runtime.load(device=i))")

    def _check_grid(self, dims) -> tuple:
        """``dims`` as three ints, or a TypeError (not three whole numbers: a bool, float or None) or a ValueError
        (outside CUDA's grid limits, or x not a multiple of the cluster's) naming the grid."""
        if len(dims) != 3:
            # A tensor's type only: a device tensor's repr reads its values back (a device sync, which a CUDA-graph
            # capture refuses with its own error)
            shown = (repr(dims) if not any(isinstance(d, torch.Tensor) for d in dims)
                     else f"({', '.join(type(d).__name__ for d in dims)})")
            raise TypeError(f"{self.name}: grid {shown} must be an int or three ints (x, y, z)")
        gx, gy, gz = dims = tuple(whole_number(f"{self.name}: grid", d) for d in dims)
        if not (0 < gx <= _GRID_MAX[0] and 0 < gy <= _GRID_MAX[1] and 0 < gz <= _GRID_MAX[2]) or gx % self._cluster_x:
            raise ValueError(f"{self.name}: grid {dims} must be positive, at most {_GRID_MAX}, with x a multiple of "
                             f"{self._cluster_x}")
        return dims

    def _set_grid(self, dims) -> None:
        """Checked before the config changes: a grid refused halfway through its fields would leave the config at
        another grid than ``_dims`` says, which the next launch with the old grid would then use."""
        gx, gy, gz = dims = self._check_grid(dims)
        config = self._config
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        self._dims = dims


_RANGES = {"Q": "[0, 2**64) for a pointer", "i": "[-2**31, 2**31)", "I": "[0, 2**32)", "q": "[-2**63, 2**63)",
           "f": "of a float"}


def _argument_block(params):
    """One buffer for a kernel's arguments, each at its native alignment, the void* array pointing at each, and
    the struct's ``pack_into`` that fills the buffer in one call."""
    layout = "@"
    offsets = []
    for param in params:
        code = _FORMATS[param.ctype]
        layout += code
        offsets.append(struct.calcsize(layout) - struct.calcsize(code))
    packer = struct.Struct(layout)
    buffer = ctypes.create_string_buffer(max(8, packer.size))
    base = ctypes.addressof(buffer)
    pointers = (ctypes.c_void_p * max(1, len(offsets)))(*[base + offset for offset in offsets])
    return packer.pack_into, buffer, pointers


# CU_STREAM_PER_THREAD; 0 and CU_STREAM_LEGACY (1) below it: the current context's default streams
_PER_THREAD_STREAM = 2
_GRID_MAX = (2 ** 31 - 1, 65535, 65535)  # CUDA's grid limits (x, y, z) on every arch the cache builds for


class _LaunchAttributes:
    """CUlaunchAttribute structs built once per load and shared by every kernel's config."""

    def __init__(self, drv):
        self._drv = drv
        self._clusters = {}
        self._pdl = None

    def cluster(self, dims):
        a = self._clusters.get(dims)
        if a is None:
            drv = self._drv
            a = drv.CUlaunchAttribute()
            a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = dims
            self._clusters[dims] = a
        return a

    def pdl(self):
        if self._pdl is None:
            drv = self._drv
            a = drv.CUlaunchAttribute()
            a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            a.value.programmaticStreamSerializationAllowed = 1
            self._pdl = a
        return self._pdl


# The host ops bind each device, at their first call there, to the cache that runtime.load() reads at that moment
# ($SPARSE_DECODE_AOT_CACHE or the default root) or to its refusal, and every op uses that one answer on the device for
# the life of the process: no two ops run kernels of two builds (the ops' own memos of kernels and plans are per device
# too, so a binding that changed later would reach only the calls not yet made), and no call pays a lookup of the root.
# A start-up runtime.load(device=i) of that root binds the device first, its refusal included, so that a capture's
# first op call does not try to load again.
_bound: dict = {}  # device index -> the KernelCache the host ops use there, or the CacheError that refused it
_refusals_said: set = set()  # (op, device index) whose fallback was said
_bound_lock = threading.RLock()  # re-entered by load() where cache_or_fallback calls it


def cache_or_fallback(op: str, device: int):
    """The host ops' question for a device: the cache bound to it (``runtime.load(device=device)`` at the first
    call), or None where the cache refused it, so that ``op`` runs its exact torch fallback there.

    A refusal is remembered (a refused load costs tens of milliseconds, which every call would pay again) and said
    once an op and device (RuntimeWarning naming it); concurrent first calls make one load. Only a CacheError is a
    refusal: any other error is raised, CacheLoadInterrupted among them (out of GPU memory or a stream capture at
    the load: the next call loads again). (Through the package's ``load``, which a caller or test may replace.)
    """
    with _bound_lock:
        answer = _bound.get(device)
        if answer is None:
            answer = _bind(op, device)
        if not isinstance(answer, CacheError):
            return answer
        if (op, device) not in _refusals_said:
            _refusals_said.add((op, device))
            warn_fallback(op, f"cuda:{device}", answer)
        return None


def _bind(op: str, device: int):
    """Load the cache of the root runtime.load() reads now for ``device`` and bind the device to it or its refusal."""
    import runtime  # noqa: PLC0415 - the package: load() is memoized per root and device

    try:
        # Only a call that would load asks about capture; is_loaded resolves the root, so a root refused as such (a
        # relative $SPARSE_DECODE_AOT_CACHE, a symlink loop) raises its PathError here and is bound as any refusal.
        if not is_loaded(device):
            _refuse_a_load_in_capture(op, device)
        answer = runtime.load(device=device)
    except CacheError as e:
        answer = e
    _bound[device] = answer
    return answer


def _bind_a_start_up_load(device: int, answer) -> None:
    """runtime.load() of the ops' root (no root given) binds a device nothing is bound to yet."""
    with _bound_lock:
        _bound.setdefault(device, answer)


def _refuse_a_load_in_capture(op: str, device: int) -> None:
    """A first call inside CUDA graph stream capture would load the cache there: torch's context set-up and the
    driver's module loading cannot be captured (the load would fail, or its work land in the graph)."""
    # No CUDA yet: nothing can be capturing. A device past torch's count is left to load(), which names it: making it
    # current to ask raised torch's 'invalid device ordinal'.
    if torch.cuda.is_initialized() and device < torch.cuda.device_count() and capturing_on(device):
        device_arch(device)  # a GPU no arch serves is refused (and bound) without a load, as outside a capture
        raise CacheLoadInterrupted(
            f"{op}: the first call on cuda:{device} came during CUDA graph stream capture and would load the AOT "
            f"cache there, which cannot be captured.",
            fix=f"load the cache before capture: runtime.load(device={device}) at start-up, or call {op} once "
                f"before capturing",
        )


def capturing_on(device: int | torch.device) -> bool:
    """Whether the current stream of the CUDA ``device`` (an index or a torch.device) is being captured into a CUDA
    graph: asked with that device current, with no switch where it already is (the indexer's plans and finishes)."""
    index = device if isinstance(device, int) else device.index
    if index is None or index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(index):
        return torch.cuda.is_current_stream_capturing()


def warn_fallback(op: str, device: str, error: BaseException) -> None:
    """Say that ``op`` runs its exact torch fallback on ``device`` because the cache cannot serve it."""
    warn_at_caller(f"{op}: the AOT cache cannot serve {device}, the exact torch fallback runs instead: "
                   f"{type(error).__name__}: {error}")


def held_kernel(op: str, device: int, name: str) -> tuple:
    """(cache, kernel): the cache bound to ``cuda:device`` for ``op`` (cache_or_fallback: None where it refused the
    device) and its kernel ``name``, None where the cache lacks it. Nothing memoized, nothing said of a missing one."""
    cache = cache_or_fallback(op, device)
    return cache, (cache.kernel(name) if cache is not None and name in cache else None)


def memo_kernel(memo: dict, key, op: str, device: int, name: str):
    """The kernel ``name`` of the cache bound to ``cuda:device`` (held_kernel), or None where the cache refused
    the device or lacks the kernel, stored in ``memo[key]`` and returned: a host op's first call on a device, whose
    later calls read ``memo`` alone. A missing kernel is said once, after the memo is filled (where warnings are
    errors, a warning raised before it would be raised again at every call). (Concurrent first calls may both fill
    it, with the same kernel.)"""
    cache, kernel = held_kernel(op, device, name)
    memo[key] = kernel
    if cache is not None and kernel is None:
        warn_missing_kernels(op, f"cuda:{device}", [name], arch=cache.arch)
    return kernel


def warn_missing_kernels(op: str, device: str, names, arch: str) -> None:
    """Say that ``op`` runs its exact torch fallback on ``device`` because the cache loaded for it (of ``arch``) lacks
    the kernels ``names``: a manifest may hold part of the contract (a build with ``--only``, a trimmed cache), or the
    contract defines none of them for the arch (sparse MLA is a Hopper kernel), which no rebuild changes."""
    wanted = set(names)
    if not wanted & {v.name for v in all_variants(arch)}:
        built_for = sorted({a for v in all_variants() if v.name in wanted for a in v.archs})
        warn_at_caller(f"{op}: {', '.join(names)} is built for {', '.join(built_for)} only, not for {device}'s {arch}, "
                       f"so the exact torch fallback runs instead (milliseconds, not microseconds)")
        return
    warn_at_caller(f"{op}: the AOT cache loaded for {device} has no kernel {', '.join(names)} (its manifest lacks it), "
                   f"so the exact torch fallback runs instead (milliseconds, not microseconds); rebuild the cache "
                   f"with build_kernels.py")


def launch_on(device: torch.device, kernel: Kernel, grid, *args) -> None:
    """``kernel.launch(grid, *args)`` on ``device``'s current stream.

    A launch goes to the current device's stream, so a call whose tensors live on another
    GPU than the current one switches devices around the launch (the common case, the
    current device, costs one comparison). A kernel loaded for another device than the
    tensors' is refused: its shared-memory and cluster attributes are that device's.
    """
    current = _current_device()
    index = current if device.index is None else device.index
    if kernel.device is not None and kernel.device != index:
        raise ValueError(f"{kernel.name}: loaded for cuda:{kernel.device}, the tensors are on cuda:{index}; "
                         f"launch the kernel of runtime.load(device={index})")
    if index == current:
        kernel.launch(grid, *args)
    else:
        with torch.cuda.device(device):
            kernel.launch(grid, *args)


# torch's current device and a device's current stream handle, without building a torch.cuda.Stream object.
# A CPU-only torch build lacks these fast accessors (it cannot launch anyway): the public calls stand in.
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_raw_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
if _current_device is None:  # pragma: no cover - CPU-only torch
    def _current_device() -> int:
        return torch.cuda.current_device()
if _raw_stream_of is None:  # pragma: no cover - CPU-only torch
    def _raw_stream_of(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


class KernelCache:
    """Every kernel of one manifest, loaded and checked for one device."""

    def __init__(self, manifest: Manifest, device: int, kernels: dict, load_profile: dict | None = None):
        self.manifest = manifest
        self.device = device
        self.arch = manifest.arch
        self._kernels = kernels
        # Milliseconds per phase of the load that built this cache, where
        # SPARSE_DECODE_AOT_LOAD_PROFILE=1 asked for them (else None).
        self.load_profile = load_profile

    def kernel(self, name: str) -> Kernel:
        try:
            return self._kernels[name]
        except KeyError:
            raise UnknownKernelError(
                f"no kernel {name!r} in the cache.", file=self.manifest.path,
                fix=f"known: {', '.join(sorted(self._kernels))}",
            ) from None

    def names(self, family: str | None = None) -> list[str]:
        return [n for n, k in self._kernels.items() if family is None or k.entry.family == family]

    def __contains__(self, name: str) -> bool:
        return name in self._kernels


_caches: dict = {}
_caches_lock = threading.Lock()


class _PhaseClock:
    """Adds the time since the previous tick to ``label`` (SPARSE_DECODE_AOT_LOAD_PROFILE=1)."""

    def __init__(self):
        self.start = self._last = time.perf_counter()
        self.ms: dict = {}

    def __call__(self, label: str) -> None:
        now = time.perf_counter()
        self.ms[label] = self.ms.get(label, 0.0) + (now - self._last) * 1e3
        self._last = now

    def report(self, kernels: int) -> dict:
        total = (time.perf_counter() - self.start) * 1e3
        return {"total_ms": total, "kernels": kernels, "phases_ms": dict(self.ms),
                "unaccounted_ms": total - sum(self.ms.values())}


def load(root: str | Path | None = None, device: int | None = None) -> KernelCache:
    """Load and validate every kernel for ``device`` (default: torch's current device).

    Memoized per (root, device): call it once before CUDA graph capture. Without ``root`` (the root of
    $SPARSE_DECODE_AOT_CACHE or the default, which the host ops use) it also binds the host ops on the device to its
    cache, or to its refusal (``cache_or_fallback``); a cache loaded from another root serves direct launches only.
    """
    clock = _PhaseClock() if env_flag(PROFILE_ENV) else None
    tick = clock or no_tick
    if not torch.cuda.is_available():
        driver()  # raises NoDriverError with the driver's own reason where there is none
        raise NoDriverError("torch sees no CUDA device.", fix="run on a GPU machine")
    device = torch.cuda.current_device() if device is None else cuda_device_index("device", device)
    if device is None:
        raise ValueError("device: runtime.load loads kernels for a CUDA device; pass its index or 'cuda:i'")
    if device >= torch.cuda.device_count():  # torch would fail an assertion
        raise ValueError(f"device: cuda:{device} does not exist, this process sees {torch.cuda.device_count()} CUDA "
                         f"device(s); pass an index below that")
    ops_root = root is None
    try:
        root = resolved_root(root)  # a refused root (a relative $SPARSE_DECODE_AOT_CACHE) is bound as any refusal
        key = (str(root), device)
        tick("torch_device_and_root")
        # An already-loaded cache is answered without the lock, which a load of another root may hold for as long
        # as it waits on that root's build lock (build_settled): a dict read is atomic, and an entry is added only
        # complete, under the lock.
        cache = _caches.get(key)
        if cache is None:
            cache = _load_once(key, root, device, clock, tick)
    except CacheError as e:
        if ops_root:  # outside _caches_lock: cache_or_fallback takes the two locks in the other order
            _bind_a_start_up_load(device, e)
        raise
    if ops_root:
        _bind_a_start_up_load(device, cache)
    return cache


def _load_once(key: tuple, root: Path, device: int, clock, tick) -> KernelCache:
    """``_caches[key]``, loaded under the lock where no other thread has loaded it yet."""
    with _caches_lock:
        if key not in _caches:
            # A direct load inside a capture too (the ops' first call asks before it loads): torch's context set-up
            # would land in the graph and the module loads fail or invalidate the capture.
            _refuse_a_load_in_capture("runtime.load", device)
            cache = _load(root, device, tick)
            if clock is not None:
                import json
                import sys

                profile = clock.report(len(cache.names()))
                cache.load_profile = profile
                print(f"runtime.load profile: {json.dumps(profile)}", file=sys.stderr)
            _caches[key] = cache
        return _caches[key]


def is_loaded(device: int, root: str | Path | None = None) -> bool:
    """Whether ``load(root, device)`` has loaded its cache already (it then returns it without a load)."""
    return (str(resolved_root(root)), int(device)) in _caches


def device_arch(device: int) -> str:
    """The cache arch that serves ``device``, from torch's device properties (no CUDA call, so it may be asked inside
    a graph capture), or a DeviceArchError where none does."""
    capability = torch.cuda.get_device_capability(device)
    arch = arch_for_capability(capability)
    if arch is None:
        raise DeviceArchError(
            f"device {device} has compute capability {capability[0]}.{capability[1]}, which no cache arch "
            f"serves ({', '.join(f'{a}: {c[0]}.{c[1]}' for a, c in ARCH_CAPABILITY.items())}).",
            fix="use the torch fallbacks on this GPU",
        )
    return arch


def _load(root: Path, device: int, tick=no_tick) -> KernelCache:
    arch = device_arch(device)
    tick("torch_device_and_root")
    with build_settled(root):  # no build's writes between the manifest and the cubins it names
        manifest = read_manifest(root, arch)
        tick("read_manifest")
        # The device's capability is the arch's exactly (arch_for_capability): not asked of torch again.
        return load_manifest(manifest, device, tick=tick, capability=ARCH_CAPABILITY[arch])


def load_manifest(manifest: Manifest, device: int, *, tick=no_tick, capability=None) -> KernelCache:
    """Load the kernels of an already-read manifest onto ``device`` (validating each)."""
    check_against_contract(manifest)  # before any cubin is read: the ops launch what the contract says
    tick("contract")
    drv = driver()
    tick("driver_import_and_cuInit")
    with torch.cuda.device(device):
        _make_primary_context_current(device)
        want = ARCH_CAPABILITY[manifest.arch]
        have = tuple(capability or torch.cuda.get_device_capability(device))
        if have != want:
            raise DeviceArchError(
                f"manifest arch {manifest.arch} needs compute capability {want[0]}.{want[1]}, "
                f"device {device} has {have[0]}.{have[1]}.", file=manifest.path,
                fix=f"load the manifest for this device's arch ({rebuild('<arch>', manifest.root)})",
            )
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        tick("torch_context")
        cu_device, smem_optin = _device_limits(drv, manifest.path)
        loader = _KernelLoader(drv, manifest, cu_device, smem_optin, sms, tick, device)
        tick("device_attributes")

        # One thread: measured on the H200, eight loader threads were slower (GIL-bound checks).
        try:
            kernels = {name: loader.load(entry) for name, entry in manifest.kernels.items()}
        except BaseException:
            loader.unload_all()  # a refused cache keeps no library (callers may retry load())
            raise
    return KernelCache(manifest, device, kernels)


def _make_primary_context_current(device: int) -> None:
    torch.cuda.init()
    torch.zeros(1, device=f"cuda:{device}")  # the primary context is current from here on


def _device_limits(drv, path: Path) -> tuple:
    """The current context's CUdevice and its opt-in shared memory per block."""
    try:
        cu_device = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
        smem_optin = check(drv.cuDeviceGetAttribute(
            drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, cu_device),
            "cuDeviceGetAttribute")
    except (CudaCallError, missing_function_error()) as e:
        raise _driver_failure(e, path, None, "check the GPU and its driver (nvidia-smi)") from None
    return cu_device, smem_optin


# The loader's newest driver call, cuFuncGetParamInfo, came with CUDA 12.4 (cuLibrary*/cuKernel* with 12.0).
_NEEDED_DRIVER = "update the NVIDIA driver to one of CUDA 12.4 or newer"


# Sticky errors: an earlier launch's fault left the CUDA context unusable, and every later driver call reports it.
_STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
})
_LOAD_EARLY = ("load the cache at start-up with runtime.load(device=i), before the engine reserves GPU memory and "
               "before any CUDA graph capture")
_RESTART = ("restart the process; find the faulting kernel with compute-sanitizer (or CUDA_LAUNCH_BLOCKING=1), "
            "since the cache's kernels were not loaded")


def _interruption(err) -> tuple[str, str] | None:
    """Why, and the fix, where a driver error says that the process's state stopped the load (not a fault of the
    cubin or the driver): out of memory or a capture, which pass (a later load, at start-up, succeeds), or a
    sticky error from an earlier fault, which no load in this process gets past. Else None."""
    name = getattr(err, "name", "")
    if name == "CUDA_ERROR_OUT_OF_MEMORY":
        return "the GPU is out of memory", _LOAD_EARLY
    if name == "CUDA_ERROR_CAPTURED_EVENT" or name.startswith("CUDA_ERROR_STREAM_CAPTURE_"):
        return "a CUDA graph stream capture is under way", _LOAD_EARLY
    if name in _STICKY_ERRORS:
        return "an earlier fault left this CUDA context unusable (a sticky error)", _RESTART
    return None


def _raise_if_interrupted(err, call: str) -> None:
    """Raise ``err`` as a CudaCallError where it is the process's state (``_driver_failure`` then makes it a
    CacheLoadInterrupted), for a call whose other errors mean something about the cubin."""
    if err and _interruption(err) is not None:
        check((err,), call)


def _interrupted(what: str, interruption: tuple[str, str], path, kernel) -> CacheLoadInterrupted:
    why, fix = interruption
    return CacheLoadInterrupted(
        f"{what}: {why}, not a fault of the cache (nothing is remembered: the next call loads again).",
        file=path, kernel=kernel, fix=fix,
    )


def _driver_failure(error: Exception, path, kernel, fix: str) -> Exception:
    """A driver call of the load that failed, as the error the host ops act on: CacheLoadInterrupted where the
    process's state stopped it (raised to the caller, not remembered), else DriverRefusedError (a refusal: the ops
    remember it and run their fallback). ``error`` is a CudaCallError or cuda-bindings' missing-function error."""
    if not isinstance(error, CudaCallError):  # the driver lacks the function: older than the loader needs
        return DriverRefusedError(f"the CUDA driver lacks a function the loader calls ({error}).", file=path,
                                  kernel=kernel, fix=_NEEDED_DRIVER)
    interruption = _interruption(error.result)
    if interruption is not None:
        return _interrupted(str(error), interruption, path, kernel)
    return DriverRefusedError(str(error), file=path, kernel=kernel, fix=fix)


class _KernelLoader:
    """Loads and checks one manifest's kernels; what the kernels share is looked up once."""

    def __init__(self, drv, manifest: Manifest, cu_device, smem_optin: int, sms: int, tick=no_tick,
                 device: int | None = None):
        self.drv, self.manifest, self.cu_device, self.smem_optin, self.sms = drv, manifest, cu_device, smem_optin, sms
        self.device = device
        self.tick = tick
        self.fix = rebuild(manifest.arch, manifest.root)
        self.attributes = _LaunchAttributes(drv)
        attr = drv.CUfunction_attribute
        self.static_smem = attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        self.max_dynamic_smem = attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self.non_portable = attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        self.libraries = []  # every CUlibrary loaded so far, unloaded again if the cache is refused

    def unload_all(self) -> None:
        while self.libraries:
            self.drv.cuLibraryUnload(self.libraries.pop())

    def load(self, entry: KernelEntry) -> Kernel:
        drv, tick, manifest = self.drv, self.tick, self.manifest
        # Path inside the root, size, sha256, the ELF's section table and attribute lists (the kernel's symbol,
        # parameter count and block shape); the driver's checks below find the symbol again and the parameter layout.
        data = read_checked_cubin(manifest, entry, sections=False, tick=tick)
        path = manifest.root / entry.cubin  # for messages
        try:
            err, library = drv.cuLibraryLoadData(data, None, None, 0, None, None, 0)
            if err:
                raise self._load_failure(err, entry, path)
            self.libraries.append(library)
            tick("cuLibraryLoadData")
            return self._check(entry, path, library)
        except (CudaCallError, missing_function_error()) as e:  # the driver refused to configure it, or lacks a call
            raise _driver_failure(e, path, entry.name, self.fix) from None

    def _load_failure(self, err, entry: KernelEntry, path: Path) -> Exception:
        """cuLibraryLoadData's error: the process's state (CacheLoadInterrupted), or the driver refusing the cubin."""
        what = f"the driver cannot load the cubin ({err.name})"
        interruption = _interruption(err)
        if interruption is not None:
            return _interrupted(what, interruption, path, entry.name)
        tools = self.manifest.toolchain.get("cuda_compiler", "?")
        return DriverRefusedError(
            f"{what}.", file=path, kernel=entry.name,
            fix=f"use a driver that supports the build's toolchain ({tools}), or {self.fix} with this driver's",
        )

    def _check(self, entry: KernelEntry, path: Path, library) -> Kernel:
        drv, tick, manifest = self.drv, self.tick, self.manifest
        err, cu_kernel = drv.cuLibraryGetKernel(library, entry.symbol.encode())
        _raise_if_interrupted(err, "cuLibraryGetKernel")  # the process's state, not a missing symbol
        if err:
            raise SymbolError(f"the driver finds no symbol {entry.symbol!r} ({err.name}).", file=path,
                              kernel=entry.name, fix=self.fix)
        tick("cuLibraryGetKernel")
        function = check(drv.cuKernelGetFunction(cu_kernel), "cuKernelGetFunction")
        tick("cuKernelGetFunction")
        # The driver's offsets and sizes of the manifest's parameters; the count (a kernel with parameters the
        # manifest lacks must not pass) and the block shape came from the kernel's ELF attribute list before the
        # load (read_checked_cubin's _check_attributes, in its "cubin_elf" phase).
        check_param_layout(entry, _driver_param_layout(drv, function, len(entry.params)), path, manifest.arch,
                           "cuFuncGetParamInfo", manifest.root)
        tick("cuFuncGetParamInfo")

        static_smem = check(drv.cuFuncGetAttribute(self.static_smem, function), "cuFuncGetAttribute")
        if entry.smem_bytes + static_smem > self.smem_optin:
            raise SharedMemoryError(
                f"needs {entry.smem_bytes} dynamic + {static_smem} static bytes of shared memory; the device allows "
                f"{self.smem_optin} per block.", file=path, kernel=entry.name,
                fix="use a device with more shared memory",
            )
        check(drv.cuKernelSetAttribute(self.max_dynamic_smem, entry.smem_bytes, cu_kernel, self.cu_device),
              "cuKernelSetAttribute(max dynamic smem)")
        if entry.non_portable_cluster:
            check(drv.cuKernelSetAttribute(self.non_portable, 1, cu_kernel, self.cu_device),
                  "cuKernelSetAttribute(non-portable cluster)")
        tick("shared_memory_attributes")
        # One config per kernel: the occupancy query's (grid = one cluster), then the launches'.
        config = Kernel._make_config(drv, entry, self.attributes)
        tick("launch_config")
        clusters = _max_active_clusters(drv, entry, function, self.sms, config)
        if clusters < 1:
            raise ClusterShapeError(
                f"the device cannot make cluster {entry.cluster} of {entry.threads}-thread CTAs with "
                f"{entry.smem_bytes} bytes of shared memory resident.", file=path, kernel=entry.name,
                fix="use a smaller cluster variant or a device that supports this shape",
            )
        tick("occupancy")
        kernel = Kernel(entry, cu_kernel, clusters, config, self.device)
        tick("kernel_object")
        return kernel


def _driver_param_layout(drv, function, count: int) -> list[tuple[int, int]]:
    """(offset, size) of the first ``count`` parameters as the driver sees them.

    Not probed past ``count`` (that call fails by design and tools such as compute-sanitizer
    report every failing API call); the count is checked against the ELF's attribute list.
    """
    layout = []
    get = drv.cuFuncGetParamInfo
    for index in range(count):
        err, offset, size = get(function, index)
        if err:
            # Past the kernel's last parameter the driver answers invalid value: a shorter list than the manifest's,
            # which the layout check names. Any other error is the driver's failure (or the process's state), named.
            if getattr(err, "name", "") != "CUDA_ERROR_INVALID_VALUE":
                check((err,), "cuFuncGetParamInfo")
            break
        layout.append((int(offset), int(size)))
    return layout


def _max_active_clusters(drv, entry: KernelEntry, function, sms: int, config) -> int:
    if entry.cluster_size == 1:
        # Not a cluster launch: resident CTAs over the whole device.
        blocks = check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, entry.threads, entry.smem_bytes),
                       "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return int(blocks) * sms
    config.gridDimX, config.gridDimY, config.gridDimZ = entry.cluster  # one cluster's worth of CTAs
    return int(check(drv.cuOccupancyMaxActiveClusters(function, config), "cuOccupancyMaxActiveClusters"))
