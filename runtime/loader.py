"""Loading the cache onto a device and launching its kernels (no JIT at serving time).

``load()`` reads the manifest for the current device's arch, checks every cubin
on the CPU side (manifest.py), loads it with ``cuLibraryLoadData`` (a library is
context-independent, so every GPU of the process can use it) and checks it against
the device: the parameter layout by ``cuFuncGetParamInfo``, shared memory against
the opt-in limit, the cluster shape by ``cuOccupancyMaxActiveClusters``. A launch
is one ``cuLaunchKernelEx`` on the current torch stream with arguments packed into
buffers prepared at load time.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from .contract import ARCH_CAPABILITY
from .driver import check, driver
from .errors import ClusterShapeError, DeviceArchError, NoDriverError, SharedMemoryError, UnknownKernelError, REBUILD
from .manifest import KernelEntry, Manifest, check_param_layout, default_root, read_checked_cubin, read_manifest

_CTYPES = {"void*": ctypes.c_uint64, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
           "float": ctypes.c_float, "int64_t": ctypes.c_int64}


def arch_for_capability(capability: tuple[int, int]) -> str | None:
    for arch, cc in ARCH_CAPABILITY.items():
        if tuple(capability) == cc:
            return arch
    return None


class Kernel:
    """One loaded kernel: its manifest entry and a prepared launch."""

    def __init__(self, entry: KernelEntry, cu_kernel, max_active_clusters: int):
        drv = driver()
        self.entry = entry
        self.name = entry.name
        self.max_active_clusters = max_active_clusters
        # The CUkernel, not a context's CUfunction: launches work from any context.
        self._function = cu_kernel
        self._launch = drv.cuLaunchKernelEx
        # Argument storage and the void* array pointing at it, built once; a launch
        # only writes values (the driver copies them, so graph capture is safe).
        self._slots = [_CTYPES[p.ctype]() for p in entry.params]
        self._pointers = (ctypes.c_void_p * max(1, len(self._slots)))(*[ctypes.addressof(s) for s in self._slots])
        self._params_address = ctypes.addressof(self._pointers)
        self._config = self._make_config(drv, entry)
        self._cluster_x = entry.cluster[0]
        self._nargs = len(self._slots)
        self._dims = None
        self._stream = None
        self._lock = threading.Lock()

    @staticmethod
    def _make_config(drv, entry: KernelEntry):
        config = drv.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = entry.threads, 1, 1
        config.sharedMemBytes = entry.smem_bytes
        attrs = []
        if entry.cluster_size > 1:
            a = drv.CUlaunchAttribute()
            a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = entry.cluster
            attrs.append(a)
        if entry.pdl:
            a = drv.CUlaunchAttribute()
            a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            a.value.programmaticStreamSerializationAllowed = 1
            attrs.append(a)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        return config

    @property
    def variant_config(self) -> dict:
        return self.entry.config

    def launch(self, grid, *args, stream=None) -> None:
        """Launch on ``stream`` (default: torch's current stream) with ``args`` in contract order.

        ``grid`` counts CTAs (an int or an (x, y, z) tuple); x must be a multiple of the
        cluster's x. Pointers are ints (``tensor.data_ptr()``). The hot path only writes
        what changed since the last launch of this kernel.
        """
        dims = (grid, 1, 1) if type(grid) is int else tuple(grid)
        if len(args) != self._nargs:
            raise TypeError(f"{self.name}: takes {self._nargs} arguments "
                            f"({', '.join(p.name for p in self.entry.params)}), got {len(args)}")
        if stream is None:
            stream = _current_raw_stream()
        elif type(stream) is not int:
            stream = stream.cuda_stream
        with self._lock:
            config = self._config
            if dims != self._dims:
                self._set_grid(dims)
            if stream != self._stream:
                config.hStream = stream
                self._stream = stream
            for slot, value in zip(self._slots, args):
                slot.value = value
            (err,) = self._launch(config, self._function, self._params_address, 0)
        if err:
            check((err,), f"cuLaunchKernelEx({self.name}, grid={grid})")

    def _set_grid(self, dims) -> None:
        gx, gy, gz = dims
        if gx <= 0 or gy <= 0 or gz <= 0 or gx % self._cluster_x:
            raise ValueError(f"{self.name}: grid {dims} must be positive with x a multiple of {self._cluster_x}")
        config = self._config
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        self._dims = dims


def _current_raw_stream() -> int:
    """torch's current stream handle, without building a torch.cuda.Stream object
    (a CPU-only torch build lacks the fast accessors; it cannot launch anyway)."""
    return _raw_stream_of(_current_device())


_raw_stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
if _raw_stream_of is None or _current_device is None:  # pragma: no cover - CPU-only torch
    def _current_raw_stream() -> int:  # noqa: F811
        return torch.cuda.current_stream().cuda_stream


class KernelCache:
    """Every kernel of one manifest, loaded and checked for one device."""

    def __init__(self, manifest: Manifest, device: int, kernels: dict):
        self.manifest = manifest
        self.device = device
        self.arch = manifest.arch
        self._kernels = kernels

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


def load(root: str | Path | None = None, device: int | None = None) -> KernelCache:
    """Load and validate every kernel for ``device`` (default: torch's current device).

    Memoized per (root, device): call it once before CUDA graph capture.
    """
    import torch

    if not torch.cuda.is_available():
        driver()  # raises NoDriverError with the driver's own reason where there is none
        raise NoDriverError("torch sees no CUDA device.", fix="run on a GPU machine")
    device = torch.cuda.current_device() if device is None else int(device)
    root = Path(root) if root is not None else default_root()
    key = (str(root.resolve()), device)
    with _caches_lock:
        if key not in _caches:
            _caches[key] = _load(root, device)
        return _caches[key]


def _load(root: Path, device: int) -> KernelCache:
    import torch

    capability = torch.cuda.get_device_capability(device)
    arch = arch_for_capability(capability)
    if arch is None:
        raise DeviceArchError(
            f"device {device} has compute capability {capability[0]}.{capability[1]}, which no cache arch "
            f"serves ({', '.join(f'{a}: {c[0]}.{c[1]}' for a, c in ARCH_CAPABILITY.items())}).",
            fix="use the torch fallbacks on this GPU",
        )
    manifest = read_manifest(root, arch)
    return load_manifest(manifest, device)


def load_manifest(manifest: Manifest, device: int) -> KernelCache:
    """Load the kernels of an already-read manifest onto ``device`` (validating each)."""
    import torch

    drv = driver()
    with torch.cuda.device(device):
        torch.cuda.init()
        torch.zeros(1, device=f"cuda:{device}")  # the primary context is current from here on
        cu_device = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
        want = ARCH_CAPABILITY[manifest.arch]
        have = torch.cuda.get_device_capability(device)
        if tuple(have) != want:
            raise DeviceArchError(
                f"manifest arch {manifest.arch} needs compute capability {want[0]}.{want[1]}, "
                f"device {device} has {have[0]}.{have[1]}.", file=manifest.path,
                fix=f"load the manifest for this device's arch ({REBUILD.format(arch='<arch>')})",
            )
        smem_optin = check(drv.cuDeviceGetAttribute(
            drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, cu_device),
            "cuDeviceGetAttribute")
        sms = torch.cuda.get_device_properties(device).multi_processor_count

        # One thread: measured on the H200, eight loader threads were slower (GIL-bound checks).
        kernels = {name: _load_kernel(drv, manifest, entry, cu_device, smem_optin, sms)
                   for name, entry in manifest.kernels.items()}
    return KernelCache(manifest, device, kernels)


def _load_kernel(drv, manifest: Manifest, entry: KernelEntry, cu_device, smem_optin: int, sms: int) -> Kernel:
    from .errors import SymbolError

    # Size, sha256, and the ELF's SM, symbol and full parameter list; the driver's view below.
    data = read_checked_cubin(manifest, entry)
    path = manifest.root / entry.cubin
    fix = REBUILD.format(arch=manifest.arch)
    library = check(drv.cuLibraryLoadData(data, None, None, 0, None, None, 0), f"cuLibraryLoadData({path})")
    err, cu_kernel = drv.cuLibraryGetKernel(library, entry.symbol.encode())
    if err != drv.CUresult.CUDA_SUCCESS:
        raise SymbolError(f"the driver finds no symbol {entry.symbol!r} ({err.name}).", file=path, kernel=entry.name, fix=fix)
    function = check(drv.cuKernelGetFunction(cu_kernel), "cuKernelGetFunction")
    check_param_layout(entry, _driver_param_layout(drv, function, len(entry.params)), path, manifest.arch,
                       "cuFuncGetParamInfo")

    static_smem = check(drv.cuFuncGetAttribute(
        drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function), "cuFuncGetAttribute")
    if entry.smem_bytes + static_smem > smem_optin:
        raise SharedMemoryError(
            f"needs {entry.smem_bytes} dynamic + {static_smem} static bytes of shared memory; the device allows "
            f"{smem_optin} per block.", file=path, kernel=entry.name, fix="use a device with more shared memory",
        )
    attr = drv.CUfunction_attribute
    check(drv.cuKernelSetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, entry.smem_bytes,
                                   cu_kernel, cu_device), "cuKernelSetAttribute(max dynamic smem)")
    if entry.non_portable_cluster:
        check(drv.cuKernelSetAttribute(attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
                                       cu_kernel, cu_device), "cuKernelSetAttribute(non-portable cluster)")
    clusters = _max_active_clusters(drv, entry, function, sms)
    if clusters < 1:
        raise ClusterShapeError(
            f"the device cannot make cluster {entry.cluster} of {entry.threads}-thread CTAs with "
            f"{entry.smem_bytes} bytes of shared memory resident.", file=path, kernel=entry.name,
            fix="use a smaller cluster variant or a device that supports this shape",
        )
    return Kernel(entry, cu_kernel, clusters)


def _driver_param_layout(drv, function, count: int) -> list[tuple[int, int]]:
    """(offset, size) of the first ``count`` parameters as the driver sees them.

    Not probed past ``count`` (that call fails by design and tools such as compute-sanitizer
    report every failing API call); the ELF check above already pinned the parameter count.
    """
    layout = []
    for index in range(count):
        err, offset, size = drv.cuFuncGetParamInfo(function, index)
        if err != drv.CUresult.CUDA_SUCCESS:
            break
        layout.append((int(offset), int(size)))
    return layout


def _max_active_clusters(drv, entry: KernelEntry, function, sms: int) -> int:
    if entry.cluster_size == 1:
        # Not a cluster launch: resident CTAs over the whole device.
        blocks = check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, entry.threads, entry.smem_bytes),
                       "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return int(blocks) * sms
    config = Kernel._make_config(drv, entry)  # one cluster's worth of CTAs
    config.gridDimX, config.gridDimY, config.gridDimZ = entry.cluster
    return int(check(drv.cuOccupancyMaxActiveClusters(function, config), "cuOccupancyMaxActiveClusters"))
