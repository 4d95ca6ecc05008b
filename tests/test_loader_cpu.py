"""runtime.load() on a CPU machine with a stand-in CUDA driver: its own checks, its typed errors.

The stand-in answers the driver calls load() makes the way the driver does, from the cubin's
ELF (a symbol the ELF lacks is not found; cuFuncGetParamInfo gives the ELF's offsets and sizes
and fails past the last parameter), and uses cuda-python's real structs and enums. The device's
side (module loading, occupancy) is only faked here; the GPU tests run it for real.
"""

import contextlib
import ctypes
import errno
import json
import os
import types
import warnings

import pytest
import torch
from crafted_cache import (
    add_param,
    contract_follows_the_manifest,
    copy_probe_cache,
    drop_last_param,
    edit_manifest,
    first_cubin,
    rewrite_first_cubin,
    sass_list_renamed,
    shift_second_param,
)

from runtime import errors, loader
from runtime import manifest as manifest_module
from runtime.cubin import read_cubin
from runtime.manifest import manifest_path

real = pytest.importorskip("cuda.bindings.driver")
OK = real.CUresult.CUDA_SUCCESS


class StandInDriver:
    """The driver calls of load(), answered from each cubin's ELF; everything else is cuda-python's."""

    def __init__(self, smem_optin=232448, clusters=14, static_smem=0, load_error=None, occupancy_error=None):
        self.smem_optin, self.clusters, self.static_smem = smem_optin, clusters, static_smem
        self.load_error, self.occupancy_error = load_error, occupancy_error
        self.symbol_error = self.param_error = None  # an error of that call for every kernel
        self.loaded, self.unloaded = [], []  # libraries, by id
        self.param_queries = []  # (symbol, index, parameter count)
        self.configs = 0
        self.occupancy_configs = []

    def __getattr__(self, name):
        return getattr(real, name)

    def CUlaunchConfig(self):  # noqa: N802 - the driver's name
        self.configs += 1
        return real.CUlaunchConfig()

    def cuCtxGetDevice(self):  # noqa: N802
        return OK, real.CUdevice(0)

    def cuDeviceGetAttribute(self, attr, device):  # noqa: N802
        return OK, self.smem_optin

    def cuLibraryLoadData(self, data, *options):  # noqa: N802
        if self.load_error is not None and len(self.loaded) == 1:  # the second cubin
            return self.load_error, None
        library = read_cubin(bytes(data)).kernels
        self.loaded.append(id(library))
        return OK, library

    def cuLibraryUnload(self, library):  # noqa: N802
        self.unloaded.append(id(library))
        return (OK,)

    def cuLibraryGetKernel(self, library, symbol):  # noqa: N802
        symbol = symbol.decode()
        if self.symbol_error is not None:
            return self.symbol_error, None
        if symbol not in library:
            return real.CUresult.CUDA_ERROR_NOT_FOUND, None
        return OK, (symbol, library[symbol])

    def cuKernelGetFunction(self, kernel):  # noqa: N802
        return OK, kernel

    def cuFuncGetParamInfo(self, function, index):  # noqa: N802
        symbol, params = function
        self.param_queries.append((symbol, index, len(params)))
        if self.param_error is not None:
            return self.param_error, 0, 0
        if index >= len(params):
            return real.CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0
        return OK, params[index].offset, params[index].size

    def cuFuncGetAttribute(self, attr, function):  # noqa: N802
        return OK, self.static_smem

    def cuKernelSetAttribute(self, attr, value, kernel, device):  # noqa: N802
        return (OK,)

    def cuOccupancyMaxActiveClusters(self, function, config):  # noqa: N802
        self.occupancy_configs.append(config)
        if self.occupancy_error is not None:
            return self.occupancy_error, 0
        return OK, self.clusters

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, threads, smem):  # noqa: N802
        return OK, 2

    def cuGetErrorString(self, err):  # noqa: N802
        return OK, b"stand-in driver error"


@pytest.fixture
def cache(tmp_path):
    return copy_probe_cache(tmp_path)


@pytest.fixture
def stand_in(monkeypatch):
    """A Hopper device as torch reports it, and the stand-in driver; returns a factory."""
    import runtime.driver

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(loader, "_make_primary_context_current", lambda device: None)
    monkeypatch.setattr(loader, "_caches", {})

    def make(**kwargs):
        drv = StandInDriver(**kwargs)
        monkeypatch.setattr(runtime.driver, "_driver", drv)
        return drv

    return make


def test_load_passes_and_builds_one_launch_config_per_kernel(cache, stand_in):
    drv = stand_in()
    loaded = loader.load(cache)
    assert set(loaded.names()) == {"probe_cluster2", "probe_cluster8"}
    assert drv.configs == 2, "one CUlaunchConfig per kernel (the occupancy query's is the launches')"
    ids = real.CUlaunchAttributeID
    for name, cluster in (("probe_cluster2", 2), ("probe_cluster8", 8)):
        kernel = loaded.kernel(name)
        assert kernel._config in drv.occupancy_configs
        attrs = {a.id: a for a in kernel._config.attrs}
        assert attrs[ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION].value.clusterDim.x == cluster
        assert ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION in attrs
        assert kernel._config.blockDimX == kernel.entry.threads and kernel.max_active_clusters == 14
    # The driver is asked for the manifest's parameters only, never past the last one.
    assert drv.param_queries and all(index < count for _, index, count in drv.param_queries)


def test_a_loaded_cache_is_answered_while_another_load_holds_the_lock(cache, stand_in):
    """A load of another root holds the loader's lock while it waits (up to 30 s) on that root's build lock: a load()
    of a cache loaded already waited behind it. It is answered without the lock."""
    import threading

    stand_in()
    loaded = loader.load(cache)
    answers = []
    with loader._caches_lock:  # another root's load, waiting on its build
        t = threading.Thread(target=lambda: answers.append(loader.load(cache)), daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "load() of a loaded cache waited for the lock"
    assert answers == [loaded]


def test_in_stream_order_drops_only_the_pdl_attribute(cache, stand_in):
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster8")
    plain = kernel.in_stream_order()
    ids = real.CUlaunchAttributeID
    assert [a.id for a in plain._config.attrs] == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION]
    assert plain._config.attrs[0].value.clusterDim.x == 8 and plain._config.numAttrs == 1
    assert ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION in [a.id for a in kernel._config.attrs]
    assert plain._function is kernel._function and plain.max_active_clusters == kernel.max_active_clusters
    assert not plain.entry.pdl and kernel.entry.pdl and plain.in_stream_order() is plain
    assert kernel.in_stream_order() is plain, "built once"


def test_launch_refuses_a_stream_of_another_device(cache, stand_in):
    """A kernel loaded for cuda:0 given a torch stream of cuda:1: refused before the driver sees it (its shared-memory
    and cluster attributes are cuda:0's); its own device's stream and a raw handle go through."""
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster2")
    launched = []
    kernel._launch = lambda config, function, params, extra: launched.append(int(config.hStream)) or (0,)
    args = [0] * len(kernel.entry.params)
    with pytest.raises(ValueError, match="stream is on cuda:1, the kernel was loaded for cuda:0"):
        kernel.launch(2, *args, stream=types.SimpleNamespace(device_index=1, cuda_stream=77))
    assert not launched
    kernel.launch(2, *args, stream=types.SimpleNamespace(device_index=0, cuda_stream=77))
    kernel.launch(2, *args, stream=78)
    assert launched == [77, 78]


def test_launch_refuses_a_grid_before_it_changes_the_config(cache, stand_in):
    """A grid refused halfway through its fields (y past CUDA's 65535 after x was set) left the config at x = 64 while
    the kernel still remembered (2, 1, 1), so the next launch of (2, 1, 1) ran 64 CTAs. Every field is checked first;
    a bool, a float or None is refused as a TypeError naming the grid; another integer type is taken."""
    np = pytest.importorskip("numpy")
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster2")
    grids = []
    kernel._launch = lambda config, function, params, extra: grids.append(
        (config.gridDimX, config.gridDimY, config.gridDimZ)) or (0,)
    args = [0] * len(kernel.entry.params)
    kernel.launch(2, *args, stream=5)
    for grid, exc in (((64, 2 ** 32, 1), ValueError), ((64, 1, 65536), ValueError), ((2 ** 31, 1, 1), ValueError),
                      ((64, None, 1), TypeError), ((64, 1.5, 1), TypeError), ((True, 1, 1), TypeError),
                      ((64, 1), TypeError), (2.0, TypeError), ((0, 1, 1), ValueError), ((3, 1, 1), ValueError)):
        with pytest.raises(exc, match=r"probe_cluster2: grid"):
            kernel.launch(grid, *args, stream=5)
    kernel.launch(2, *args, stream=5)
    # the grid it holds, given as floats, a bool or a tensor: refused all the same (it compared equal and was taken)
    for grid in ((2.0, 1, 1), (2, 1.0, 1), [2, True, 1], (torch.tensor(2.0), 1, 1)):
        with pytest.raises(TypeError, match=r"probe_cluster2: grid"):
            kernel.launch(grid, *args, stream=5)
    kernel.launch(np.int64(4), *args, stream=5)
    kernel.launch((np.int32(6), 2, 1), *args, stream=5)
    kernel.launch((np.int32(6), 2, 1), *args, stream=5)
    assert grids == [(2, 1, 1), (2, 1, 1), (4, 1, 1), (6, 2, 1), (6, 2, 1)]
    assert all(type(d) is int for d in kernel._dims)


def test_load_refuses_a_device_the_process_does_not_see(cache, stand_in):
    """torch fails an assertion for a device index past its count: refused as a ValueError naming the device."""
    stand_in()
    with pytest.raises(ValueError, match=r"^device: cuda:2 does not exist, this process sees 2 CUDA device"):
        loader.load(cache, device=2)


def test_load_takes_cuda_0_by_name_where_another_device_is_current(cache, stand_in, monkeypatch):
    """"cuda:0" and torch.device("cuda", 0) are device 0 (index 0 is not "no index", the current device's)."""
    stand_in()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert [loader.load(cache, device=d).device for d in ("cuda:0", torch.device("cuda", 0), "cuda")] == [0, 0, 1]


@pytest.mark.parametrize("error", [errno.EMFILE, errno.ENFILE, errno.ENOMEM], ids=errno.errorcode.get)
def test_a_process_out_of_descriptors_is_not_a_refusal(cache, stand_in, monkeypatch, error):
    """Reading the manifest or a cubin fails for the process's state (out of file descriptors, or of kernel memory):
    CacheLoadInterrupted, not a CacheError the ops would remember, so a later call loads again."""
    stand_in()
    real_read = manifest_module._read_regular_file
    failing = {"manifest"}

    def read(path, limit, inside=None):
        if ("manifest" if path.endswith(".json") else "cubin") in failing:
            raise OSError(error, os.strerror(error))
        return real_read(path, limit, inside)

    monkeypatch.setattr(manifest_module, "_read_regular_file", read)
    for what in ("manifest", "cubin"):
        failing = {what}
        with pytest.raises(errors.CacheLoadInterrupted, match=rf"could not open or read the {what}") as e:
            loader.load(cache)
        assert not isinstance(e.value, errors.CacheError) and "the next call loads again" in e.value.fix
    failing = set()
    assert set(loader.load(cache).names()) == {"probe_cluster2", "probe_cluster8"}


def _recording_launches(kernel) -> list:
    """The stream of each launch of ``kernel`` (its cuLaunchKernelEx replaced)."""
    launched = []
    kernel._launch = lambda config, function, params, extra: launched.append(int(config.hStream)) or (0,)
    return launched


def _probe_on_device_0(cache):
    """probe_cluster2 loaded for cuda:0, and the stream of each of its launches from now on."""
    kernel = loader.load(cache, device=0).kernel("probe_cluster2")
    return kernel, _recording_launches(kernel)


def _device_stand_in(state: dict):
    """A stand-in for torch.cuda.device: ``state["index"]`` is the current device, d inside the block."""
    @contextlib.contextmanager
    def device(d):
        before, state["index"] = state["index"], d.index if isinstance(d, torch.device) else d
        try:
            yield
        finally:
            state["index"] = before

    return device


@contextlib.contextmanager
def _switching_device(monkeypatch, current: int):
    """torch's current device starts at ``current``; torch.cuda.device(d) makes d current inside the block.
    Each device's current stream handle is 1000 + its index."""
    state = {"index": current}
    monkeypatch.setattr(loader, "_current_device", lambda: state["index"])
    monkeypatch.setattr(loader, "_raw_stream_of", lambda index: 1000 + index)
    monkeypatch.setattr(loader.torch.cuda, "device", _device_stand_in(state))
    yield state


def test_default_stream_of_another_device_is_refused(cache, stand_in, monkeypatch):
    """kernel.launch(grid, *args) takes torch's current stream: where the current device is not the kernel's, it is
    refused (the kernel's attributes are its device's); launch_on switches to the tensors' device and launches."""
    stand_in()
    kernel, launched = _probe_on_device_0(cache)
    with _switching_device(monkeypatch, current=1) as state:
        with pytest.raises(ValueError, match="probe_cluster2: torch's current device is cuda:1, the kernel was loaded "
                                             "for cuda:0.*runtime.load\\(device=i\\)"):
            kernel.launch(2, 0, 0)
        assert not launched
        loader.launch_on(torch.device("cuda", 0), kernel, 2, 0, 0)
        assert launched == [1000] and state["index"] == 1, "cuda:0's stream, then cuda:1 current again"
        state["index"] = 0
        kernel.launch(2, 0, 0)
        assert launched == [1000, 1000]


def test_stream_zero_of_another_device_is_refused(cache, stand_in, monkeypatch):
    """Stream 0 is the legacy default stream of the current context, so it names a device as None does: refused where
    torch's current device is not the kernel's, launched where it is. Another raw handle cannot say its device."""
    stand_in()
    kernel, launched = _probe_on_device_0(cache)
    with _switching_device(monkeypatch, current=1) as state:
        with pytest.raises(ValueError, match="probe_cluster2: stream handle 0 names the default stream of the "
                                             "current device, cuda:1, the kernel was loaded for cuda:0"):
            kernel.launch(2, 0, 0, stream=0)
        kernel.launch(2, 0, 0, stream=7)
        state["index"] = 0
        kernel.launch(2, 0, 0, stream=0)
    assert launched == [7, 0]


@pytest.mark.parametrize("handle", [1, 2], ids=["CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD"])
def test_the_special_default_stream_handles_of_another_device_are_refused(cache, stand_in, monkeypatch, handle):
    """CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) name a default stream of the current context, as 0 does: a
    launch on them while another device is current ran there (the kernel's attributes are its own device's)."""
    stand_in()
    kernel, launched = _probe_on_device_0(cache)
    with _switching_device(monkeypatch, current=1) as state:
        with pytest.raises(ValueError, match=f"probe_cluster2: stream handle {handle} names the default stream of "
                                             f"the current device, cuda:1, the kernel was loaded for cuda:0"):
            kernel.launch(2, 0, 0, stream=handle)
        assert not launched
        state["index"] = 0
        kernel.launch(2, 0, 0, stream=handle)
        kernel.launch(2, 0, 0, stream=3)  # another raw handle cannot say its device
    assert launched == [handle, 3]


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_a_torch_default_stream_of_the_kernels_device_is_refused_while_another_is_current(cache, stand_in, monkeypatch,
                                                                                          handle):
    """torch's default stream of cuda:0 (torch.cuda.current_stream(0) where none was set) has the handle 0, which the
    driver resolves against the current context: with cuda:1 current, the kernel of cuda:0 ran on cuda:1's default
    stream, its device index passing the stream check. Refused as stream=0 is; launched once cuda:0 is current, and a
    torch stream of its own handle launches whichever device is current."""
    stand_in()
    kernel, launched = _probe_on_device_0(cache)
    with _switching_device(monkeypatch, current=1) as state:
        default = types.SimpleNamespace(device_index=0, cuda_stream=handle)
        with pytest.raises(ValueError, match=f"probe_cluster2: stream handle {handle} names the default stream of "
                                             f"the current device, cuda:1, the kernel was loaded for cuda:0"):
            kernel.launch(2, 0, 0, stream=default)
        assert not launched
        kernel.launch(2, 0, 0, stream=types.SimpleNamespace(device_index=0, cuda_stream=77))
        state["index"] = 0
        kernel.launch(2, 0, 0, stream=default)
    assert launched == [77, handle]


@pytest.mark.parametrize("stream, kind, shown", [
    (-1, ValueError, "got -1"),
    (2 ** 64, ValueError, f"got {2 ** 64}"),
    (7.0, TypeError, "got 7.0"),
    ("7", TypeError, "got str"),
    (types.SimpleNamespace(), TypeError, "got SimpleNamespace"),  # torch.accelerator's torch.Stream has no cuda_stream
])
def test_a_stream_no_cuda_stream_handle_holds_is_refused_naming_stream(cache, stand_in, stream, kind, shown):
    """A negative or over-wide handle raised cuda-python's bare OverflowError from the launch config, and an object
    without cuda_stream an AttributeError, neither naming the argument; the config keeps its last stream."""
    stand_in()
    kernel, launched = _probe_on_device_0(cache)
    kernel.launch(2, 0, 0, stream=7)
    with pytest.raises(kind, match=f"probe_cluster2: stream must be a torch.cuda.Stream, a CUstream handle .* "
                                   f"{shown}; pass torch.cuda.current_stream"):
        kernel.launch(2, 0, 0, stream=stream)
    kernel.launch(2, 0, 0, stream=7)  # the config was left as it was
    kernel.launch(2, 0, 0, stream=8)
    assert launched == [7, 7, 8]


def test_a_launch_without_a_current_context_binds_the_devices_and_launches(cache, stand_in, monkeypatch):
    """A thread whose first CUDA work is a launch (an op given every buffer) has no current context, and a CUkernel on
    the default stream runs in the current one: the driver answers CUDA_ERROR_INVALID_CONTEXT. The launch makes its
    device's primary context current, as torch's first call in a thread does, and launches again, once."""
    stand_in()
    kernel = loader.load(cache, device=1).kernel("probe_cluster2")
    answers = [real.CUresult.CUDA_ERROR_INVALID_CONTEXT, OK]
    kernel._launch = lambda config, function, params, extra: (answers.pop(0),)
    bound = []
    monkeypatch.setattr(loader, "_make_primary_context_current", bound.append)
    kernel.launch(2, 0, 0, stream=7)
    assert bound == [1] and answers == []
    answers[:] = [real.CUresult.CUDA_ERROR_INVALID_CONTEXT, real.CUresult.CUDA_ERROR_INVALID_CONTEXT]
    with pytest.raises(Exception, match="CUDA_ERROR_INVALID_CONTEXT"):
        kernel.launch(2, 0, 0, stream=7)  # still none: said, not retried again
    assert bound == [1, 1] and answers == []


def test_load_reads_only_the_elf_header(cache, stand_in, monkeypatch):
    import runtime.manifest

    def refuse(*args, **kwargs):
        raise AssertionError("load() parsed every ELF section")

    monkeypatch.setattr(runtime.manifest, "check_cubin_against_entry", refuse)
    monkeypatch.setattr(runtime.manifest, "read_cubin", refuse)
    monkeypatch.setattr(runtime.manifest, "symbol_table_entries", refuse)  # check_cache's symbol table walk too
    stand_in()
    assert "probe_cluster8" in loader.load(cache)


def test_load_refuses_an_entry_contradicting_the_contract_before_reading_cubins(cache, stand_in):
    """probe_cluster2 is compiled for clusters of 2 with (out, seed): a manifest saying clusters of 4 and other
    parameter names is refused before any cubin is read (here the first one is even missing) or loaded."""
    def edit(data):
        kernel = data["kernels"][0]
        kernel["cluster"] = [4, 1, 1]
        for p in kernel["params"]:
            p["name"] = "renamed"

    edit_manifest(cache, "sm_90a", edit)
    first_cubin(cache).unlink()
    drv = stand_in()
    with pytest.raises(errors.ContractMismatchError, match="probe_cluster2: the entry differs from this runtime's "
                                                           "contract in cluster, params") as e:
        loader.load(cache)
    assert isinstance(e.value, errors.CacheError) and not drv.loaded


def test_symbol_missing_is_a_typed_error_at_load(cache, stand_in):
    """Refused from the ELF's attribute lists before the driver is handed the bytes (it reads those lists as it
    loads), not by the driver's symbol lookup after the load."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0].update(symbol="kernel_that_is_not_there"))
    drv = stand_in()
    with pytest.raises(errors.SymbolError, match="probe_cluster2.*cubin has no kernel symbol 'kernel_that_is_not_th"):
        loader.load(cache)
    assert not drv.loaded


@pytest.mark.parametrize("edit, match", [
    (shift_second_param, "contradict cuFuncGetParamInfo"),
    (add_param, "lists 3 parameters, the cubin's ELF has 2"),  # the ELF's count is read before the driver load
    (drop_last_param, "lists 1 parameters, the cubin's ELF has 2"),
])
def test_param_list_contradicting_the_binary_at_load(cache, stand_in, monkeypatch, edit, match):
    edit_manifest(cache, "sm_90a", edit)
    contract_follows_the_manifest(monkeypatch, cache)  # the cubin, not the contract, disagrees
    stand_in()
    with pytest.raises(errors.ParamLayoutError, match=match) as e:
        loader.load(cache)
    assert e.value.kernel == "probe_cluster2" and "build_kernels.py --arch sm_90a" in str(e.value)


def test_shared_memory_above_the_opt_in_limit(cache, stand_in, monkeypatch):
    stand_in(smem_optin=64)
    with pytest.raises(errors.SharedMemoryError, match="128 dynamic"):
        loader.load(cache)
    # Dynamic and static together: up to the limit loads, a byte past it is refused.
    stand_in(smem_optin=128 + 16, static_smem=16)
    loader.load(cache)
    monkeypatch.setattr(loader, "_caches", {})
    stand_in(smem_optin=128 + 15, static_smem=16)
    with pytest.raises(errors.SharedMemoryError, match="128 dynamic [+] 16 static bytes .* allows 143 per block"):
        loader.load(cache)


def test_cluster_shape_the_device_cannot_launch(cache, stand_in):
    stand_in(clusters=0)
    with pytest.raises(errors.ClusterShapeError, match="cluster \\(2, 1, 1\\)"):
        loader.load(cache)


def _flip_a_byte(root):
    f = first_cubin(root)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))


def _other_arch(root):
    import hashlib

    other = first_cubin(root, "sm_100a").read_bytes()
    first_cubin(root).write_bytes(other)

    def swap(data):
        data["kernels"][0].update(size=len(other), sha256=hashlib.sha256(other).hexdigest())

    edit_manifest(root, "sm_90a", swap)


def _cubin_linked_out_of_the_root(root):
    """The first cubin moved out of the root, a symlink to it in its place (same bytes, size and sha256)."""
    cubin, outside = first_cubin(root), root.parent / f"{root.name}_outside.cubin"
    cubin.rename(outside)
    cubin.symlink_to(outside)


@pytest.mark.parametrize("craft, error, match", [
    (lambda root: first_cubin(root).unlink(), errors.MissingCubinError, "missing"),
    (_cubin_linked_out_of_the_root, errors.PathError, "probe_cluster2: cubin resolves to .*, outside the cache root"),
    (lambda root: first_cubin(root).write_bytes(first_cubin(root).read_bytes()[:100]), errors.CubinIntegrityError,
     "truncated"),
    (_flip_a_byte, errors.CubinIntegrityError, "sha256"),
    (_other_arch, errors.CubinArchError, "sm_100.*sm_90a"),
    (lambda root: edit_manifest(root, "sm_90a", lambda d: d["kernels"][0].update(cubin="../x.cubin")),
     errors.PathError, "leaves the cache root"),
    (lambda root: edit_manifest(root, "sm_90a", lambda d: d.update(schema=2)), errors.SchemaError, "schema"),
    (lambda root: edit_manifest(root, "sm_90a", lambda d: d["kernels"].append(dict(d["kernels"][0]))),
     errors.DuplicateKernelError, "twice"),
])
def test_cpu_side_refusals_through_load(cache, stand_in, craft, error, match):
    craft(cache)
    stand_in()
    with pytest.raises(error, match=match):
        loader.load(cache)


def test_manifest_arch_the_device_cannot_run(cache, stand_in):
    from runtime.manifest import read_manifest

    stand_in()
    with pytest.raises(errors.DeviceArchError, match="sm_100a needs compute capability 10.0"):
        loader.load_manifest(read_manifest(cache, "sm_100a"), 0)


def test_load_profile_on_request(cache, stand_in, monkeypatch, capsys):
    stand_in()
    monkeypatch.setenv(loader.PROFILE_ENV, "1")
    profile = loader.load(cache).load_profile
    phases = profile["phases_ms"]
    for phase in ("read_manifest", "cubin_read", "cubin_sha256", "cubin_elf", "cuLibraryLoadData",
                  "cuFuncGetParamInfo", "occupancy", "kernel_object"):
        assert phases[phase] >= 0, phase
    assert profile["kernels"] == 2
    assert abs(profile["total_ms"] - sum(phases.values()) - profile["unaccounted_ms"]) < 1e-6
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("runtime.load profile: ") and json.loads(line.split(": ", 1)[1])["kernels"] == 2


def test_no_profile_by_default(cache, stand_in, monkeypatch):
    stand_in()
    monkeypatch.delenv(loader.PROFILE_ENV, raising=False)
    assert loader.load(cache).load_profile is None
    assert manifest_path(cache, "sm_90a").is_file()


def test_launch_on_switches_to_the_tensors_device(monkeypatch):
    """A launch goes to the current device's stream: launch_on makes the tensors' device current around it."""
    calls = []

    class FakeKernel:
        device = None  # not tied to a device, as Kernel's stand-ins

        def launch(self, grid, *args):
            calls.append((current["index"], grid, args))

    with _switching_device(monkeypatch, current=0) as current:
        kernel = FakeKernel()
        loader.launch_on(torch.device("cuda", 0), kernel, 4, 1, 2)
        loader.launch_on(torch.device("cuda", 1), kernel, 8, 3)
        loader.launch_on(torch.device("cuda"), kernel, 2)
        assert calls == [(0, 4, (1, 2)), (1, 8, (3,)), (0, 2, ())]
        assert current["index"] == 0  # restored after the launch on device 1
        # A kernel loaded for device 0 (its shared-memory and cluster attributes are device 0's) is refused on 1.
        kernel.device, kernel.name = 0, "probe_cluster2"
        with pytest.raises(ValueError, match="probe_cluster2: loaded for cuda:0, the tensors are on cuda:1"):
            loader.launch_on(torch.device("cuda", 1), kernel, 8, 3)
        loader.launch_on(torch.device("cuda"), kernel, 2)
        assert calls[-1] == (0, 2, ()) and len(calls) == 4


@pytest.mark.parametrize("kwargs, error, match", [
    ({"load_error": real.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION}, errors.DriverRefusedError,
     "probe_cluster8.*cannot load the cubin"),
    ({"occupancy_error": real.CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE}, errors.DriverRefusedError,
     "probe_cluster2.*cuOccupancyMaxActiveClusters"),
    ({"clusters": 0}, errors.ClusterShapeError, "probe_cluster2"),
])
def test_refused_load_is_a_cache_error_and_unloads_its_libraries(cache, stand_in, kwargs, error, match):
    """A driver that refuses a cubin (e.g. older than the toolchain) is a CacheError, which the ops'
    fallbacks catch, and a refused load leaves no CUlibrary behind (the ops retry load())."""
    drv = stand_in(**kwargs)
    with pytest.raises(error, match=match):
        loader.load(cache)
    assert drv.loaded and sorted(drv.unloaded) == sorted(drv.loaded)


@pytest.fixture
def ops_cache(cache, stand_in, monkeypatch):
    """The host ops' load (cache_or_fallback: runtime.load(device=i)) reads the crafted cache, with a fresh memo of
    refused devices; returns the stand-in driver."""
    import runtime

    drv = stand_in()
    monkeypatch.setattr(runtime, "load", lambda device=None: loader.load(cache, device=device))
    monkeypatch.setattr(loader, "_bound", {})
    monkeypatch.setattr(loader, "_refusals_said", set())
    return drv


def test_a_manifest_param_without_size_binds_a_refusal(ops_cache, cache):
    """A parameter of an unknown C type and no size raised a bare KeyError from the manifest's schema check: no
    CacheError, so no refusal was bound and every op call reloaded the cache and raised it again."""
    edit_manifest(cache, "sm_90a", lambda d: d["kernels"][0]["params"].__setitem__(
        0, {"name": "out", "ctype": "int16_t", "offset": 0}))
    with pytest.warns(RuntimeWarning, match="SchemaError"):
        assert loader.cache_or_fallback("decode_topk", 0) is None
    assert isinstance(_refusal_of(0), errors.SchemaError)


def _refusal_of(device: int):
    """The refusal cache_or_fallback has bound ``device`` to."""
    refusal = loader._bound[device]
    assert isinstance(refusal, errors.CacheError), refusal
    return refusal


@pytest.mark.parametrize("kwargs, match", [
    ({"load_error": real.CUresult.CUDA_ERROR_OUT_OF_MEMORY},
     "probe_cluster8.*cannot load the cubin \\(CUDA_ERROR_OUT_OF_MEMORY\\): the GPU is out of memory"),
    ({"load_error": real.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
     "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\\): a CUDA graph stream capture is under way"),
    ({"occupancy_error": real.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED},
     "probe_cluster2.*cuOccupancyMaxActiveClusters failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.*capture is under"),
    ({"symbol_error": real.CUresult.CUDA_ERROR_OUT_OF_MEMORY},
     "probe_cluster2.*cuLibraryGetKernel failed: CUDA_ERROR_OUT_OF_MEMORY.*the GPU is out of memory"),
    ({"param_error": real.CUresult.CUDA_ERROR_OUT_OF_MEMORY},
     "probe_cluster2.*cuFuncGetParamInfo failed: CUDA_ERROR_OUT_OF_MEMORY.*the GPU is out of memory"),
    ({"load_error": real.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS},
     "CUDA_ERROR_ILLEGAL_ADDRESS\\): an earlier fault left this CUDA context unusable \\(a sticky error\\)"),
    ({"symbol_error": real.CUresult.CUDA_ERROR_LAUNCH_FAILED},
     "cuLibraryGetKernel failed: CUDA_ERROR_LAUNCH_FAILED.*sticky error"),
])
def test_load_stopped_by_memory_or_capture_is_raised_not_remembered(ops_cache, kwargs, match):
    """Out of GPU memory, a stream capture under way or a sticky error at the first call is the process's state, not
    the cache's fault: CacheLoadInterrupted (not a CacheError) reaches the caller with the fix, nothing is remembered, and once
    the state has passed the op's next call loads the cache (it ran its millisecond fallback for good before)."""
    drv = ops_cache
    for key, value in kwargs.items():
        setattr(drv, key, value)
    with pytest.raises(errors.CacheLoadInterrupted, match=match) as e:
        loader.cache_or_fallback("decode_topk", 0)
    assert not isinstance(e.value, errors.CacheError)
    assert "toolchain" not in str(e.value)
    if "sticky" in match:
        assert "restart the process" in e.value.fix
    else:
        assert "runtime.load(device=i)" in e.value.fix and "before any CUDA graph capture" in e.value.fix
    assert drv.loaded and sorted(drv.unloaded) == sorted(drv.loaded), "the failed load keeps no library"
    assert loader._bound == {}
    drv.load_error = drv.occupancy_error = drv.symbol_error = drv.param_error = None
    assert set(loader.cache_or_fallback("decode_topk", 0).names()) == {"probe_cluster2", "probe_cluster8"}


def test_a_driver_failure_reading_the_parameters_is_named_not_taken_for_a_layout_mismatch(ops_cache):
    """cuFuncGetParamInfo's errors other than the process's state ended the parameter list: an unsupported call read
    as 'parameters ... contradict cuFuncGetParamInfo: []', the kernel and the contract disagreeing, with the driver's
    error named nowhere. Only its answer past the last parameter (invalid value) ends the list now."""
    drv = ops_cache
    drv.param_error = real.CUresult.CUDA_ERROR_NOT_SUPPORTED
    loader.cache_or_fallback("decode_topk", 0)
    refusal = _refusal_of(0)
    assert isinstance(refusal, errors.DriverRefusedError), refusal
    assert "cuFuncGetParamInfo failed: CUDA_ERROR_NOT_SUPPORTED" in str(refusal)
    assert "contradict" not in str(refusal)


def test_first_call_during_graph_capture_is_refused_with_the_fix(cache, stand_in, monkeypatch):
    """The first call of an op on a device loads the cache: inside CUDA graph stream capture that is refused before
    any load (a RuntimeError naming the op, the device and the fix, not a remembered CacheError). Once the cache is
    loaded, capture is not even asked about."""
    from runtime.manifest import CACHE_ROOT_ENV

    drv = stand_in()
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))  # runtime.load(device=i), as the ops call it, reads this cache
    monkeypatch.setattr(loader, "_bound", {})
    capturing = {"now": True, "asked": 0}

    def is_current_stream_capturing():
        capturing["asked"] += 1
        return capturing["now"]

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", is_current_stream_capturing)
    with pytest.raises(errors.CacheLoadInterrupted, match="sparse_mla_decode: the first call on cuda:0 came during "
                                                          "CUDA graph stream capture") as e:
        loader.cache_or_fallback("sparse_mla_decode", 0)
    assert not isinstance(e.value, errors.CacheError) and "runtime.load(device=0)" in e.value.fix
    assert not drv.loaded and loader._bound == {} and not loader.is_loaded(0)
    capturing["now"] = False
    loaded = loader.cache_or_fallback("sparse_mla_decode", 0)
    assert loader.is_loaded(0) and "probe_cluster2" in loaded
    capturing["now"], capturing["asked"] = True, 0
    assert loader.cache_or_fallback("decode_topk", 0) is loaded and capturing["asked"] == 0


def test_a_device_past_the_count_asked_of_the_ops_is_refused_naming_it_once_cuda_is_initialized(cache, stand_in,
                                                                                                  monkeypatch):
    """max_tokens(width, device=i) and load_kernels(i, ...) with i past the devices torch sees: once CUDA was
    initialized, the first call's capture check made cuda:i current and raised torch's 'invalid device ordinal'
    (runtime.load's ValueError naming the device came only before CUDA's initialization). Now that ValueError both
    ways, and nothing is bound."""
    from runtime import sparse_mla, topk
    from runtime.manifest import CACHE_ROOT_ENV

    stand_in()
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))
    monkeypatch.setattr(loader, "_bound", {})
    monkeypatch.setattr(sparse_mla, "_kernels", {})
    monkeypatch.setattr(topk, "_plans", {})

    def device(index):  # torch.cuda.device(i) past the count: cudaSetDevice's error
        if index >= 2:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    past = r"^device: cuda:2 does not exist, this process sees 2 CUDA device\(s\)"
    for initialized in (False, True):
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda initialized=initialized: initialized)
        with pytest.raises(ValueError, match=past):
            sparse_mla.max_tokens(640, 2)
        with pytest.raises(ValueError, match=past):
            topk.load_kernels("cuda:2", torch.float32, False)
    assert loader._bound == {} and sparse_mla._kernels == {} and topk._plans == {}


def test_a_direct_load_during_graph_capture_is_refused_before_it_loads(cache, stand_in, monkeypatch):
    """runtime.load(device=i) called inside a capture (not through an op's first call) made the primary context
    current (torch.zeros on the capturing stream) and loaded every cubin there. Refused as the ops' first call is,
    before anything runs; a loaded cache is answered during capture."""
    drv = stand_in()
    contexts = []
    monkeypatch.setattr(loader, "_make_primary_context_current", contexts.append)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    capturing = {"now": True}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["now"])
    with pytest.raises(errors.CacheLoadInterrupted, match="runtime.load: the first call on cuda:0 came during CUDA "
                                                          "graph stream capture"):
        loader.load(cache, device=0)
    assert not contexts and not drv.loaded and not loader.is_loaded(0, cache)
    capturing["now"] = False
    loaded = loader.load(cache, device=0)
    capturing["now"] = True
    assert loader.load(cache, device=0) is loaded and len(drv.loaded) == 2


def _function_not_found(name):
    from cuda.bindings._internal.utils import FunctionNotFoundError

    def call(*args):
        raise FunctionNotFoundError(f"function {name} is not found")  # as cuda-bindings 13 says it

    return call


@pytest.mark.parametrize("call", ["cuFuncGetParamInfo", "cuLibraryLoadData", "cuDeviceGetAttribute"])
def test_driver_without_a_function_the_loader_calls_is_a_refusal(ops_cache, call):
    """A driver older than a call the loader makes (cuFuncGetParamInfo: 12.4) is a lasting refusal: a
    DriverRefusedError naming the driver needed, remembered, the op's fallback said once (it escaped as cuda-bindings'
    RuntimeError before, on every call)."""
    drv = ops_cache
    setattr(drv, call, _function_not_found(call))
    with pytest.warns(RuntimeWarning, match=f"DriverRefusedError.*function {call} is not found.*CUDA 12.4 or newer"):
        assert loader.cache_or_fallback("decode_topk", 0) is None
    assert isinstance(_refusal_of(0), errors.DriverRefusedError)
    assert sorted(drv.unloaded) == sorted(drv.loaded)
    assert loader.cache_or_fallback("decode_topk", 0) is None  # remembered: not loaded again, not said again


def test_device_query_the_driver_refuses_is_a_cache_error(cache, ops_cache):
    """load_manifest's own driver calls (the device's limits) fail as a DriverRefusedError, not a CudaCallError."""
    ops_cache.cuDeviceGetAttribute = lambda attr, device: (real.CUresult.CUDA_ERROR_INVALID_CONTEXT, 0)
    with pytest.raises(errors.DriverRefusedError, match="cuDeviceGetAttribute failed: CUDA_ERROR_INVALID_CONTEXT"
                                                        ".*nvidia-smi"):
        loader.load(cache, device=0)


def test_a_bug_in_a_driver_call_is_not_a_refusal(ops_cache):
    """Only the driver's errors become refusals: any other exception (a bug) is raised as it is."""
    def broken(*args):
        raise RuntimeError("a bug")

    ops_cache.cuFuncGetParamInfo = broken
    with pytest.raises(RuntimeError, match="^a bug$"):
        loader.cache_or_fallback("decode_topk", 0)
    assert loader._bound == {}


def test_malformed_section_table_never_reaches_the_driver(cache, stand_in):
    """A cubin whose sha256 matches but whose section table runs past the end: refused on the CPU
    (the real driver hung or crashed on this one on the H200)."""
    import struct

    _never_reaches_the_driver(cache, stand_in, lambda data: struct.pack_into("<Q", data, 0x28, len(data) - 8))  # e_shoff


def _never_reaches_the_driver(cache, stand_in, craft) -> None:
    """The first cubin crafted by ``craft`` (its manifest size and sha256 rewritten to match) is refused as an
    unreadable ELF before any library is loaded."""
    rewrite_first_cubin(cache, "sm_90a", craft)
    drv = stand_in()
    with pytest.raises(errors.CubinIntegrityError, match="probe_cluster2.*not a readable CUDA ELF"):
        loader.load(cache)
    assert drv.loaded == []


@pytest.mark.parametrize("where", ["headers", "segment", "segment offset", "one header", "entry size",
                                   "wide entry"])
def test_malformed_program_headers_never_reach_the_driver(cache, stand_in, where):
    """The section table was bounds-checked before the bytes went to the driver, the program headers (by which it
    places the segments) not: a cubin with 60000 of them, or a segment 2^40 bytes long, whose sha256 matched an
    edited manifest, was handed to cuLibraryLoadData. Refused on the CPU like a malformed section table."""
    import struct

    def craft(data):
        (phoff,) = struct.unpack_from("<Q", data, 0x20)
        assert struct.unpack_from("<H", data, 0x38)[0] > 0
        if where == "headers":
            struct.pack_into("<H", data, 0x38, 60000)  # e_phnum
        elif where in ("segment", "one header"):
            struct.pack_into("<QQQQ", data, phoff + 8, 0, 0, 0, 1 << 40)  # p_offset, p_vaddr, p_paddr, p_filesz
            if where == "one header":
                struct.pack_into("<H", data, 0x38, 1)
        elif where == "segment offset":
            struct.pack_into("<QQQQ", data, phoff + 8, len(data) - 4, 0, 0, 8)  # 8 bytes from 4 before the end
        else:
            struct.pack_into("<H", data, 0x36, 32 if where == "entry size" else 64)  # e_phentsize: not ELF64's 56

    _never_reaches_the_driver(cache, stand_in, craft)


def _section_name_past_its_table(where: str):
    """An edit of a cubin's bytes: a section that is no attribute list (the last header's) named from 4 GiB past the
    section-name string table, or that table one byte shorter, so that its last name runs past its end."""
    def edit(data):
        import struct

        from runtime.cubin import _section_heads

        heads, shstrndx = _section_heads(bytes(data))
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        (shentsize,) = struct.unpack_from("<H", data, 0x3A)
        if where == "name offset":
            other = next(i for i in reversed(range(len(heads))) if i != shstrndx)
            struct.pack_into("<I", data, shoff + other * shentsize, 0xFFFFFF00)  # sh_name
        else:
            struct.pack_into("<Q", data, shoff + shstrndx * shentsize + 32, heads[shstrndx][5] - 1)  # sh_size
    return edit


@pytest.mark.parametrize("where", ["name offset", "unterminated table"])
def test_a_section_name_past_its_string_table_never_reaches_the_driver(cache, stand_in, where):
    """The section table was bounds-checked but not the sections' names: a name offset 4 GiB past the string table
    (which check_cache refused, reading the names) or a table whose last name has no NUL inside it passed the load's
    checks and went to the driver, which finds the attribute lists by their names."""
    _never_reaches_the_driver(cache, stand_in, _section_name_past_its_table(where))


def _record_past_its_list(record: bytes):
    """An edit of a cubin's bytes: its attribute-list record that starts with ``record`` (format 4, an attribute, a
    16-bit size; the last of its list in the committed probe) says it holds 8 bytes more, past its section's end."""
    def edit(data):
        at = bytes(data).index(record)
        data[at + 2] += 8
    return edit


@pytest.mark.parametrize("record", [b"\x04\x12\x08\x00", b"\x04\x36\x04\x00"], ids=["global list", "kernel's list"])
def test_an_attribute_list_running_past_its_section_never_reaches_the_driver(cache, stand_in, record):
    """Loader audit (review-65b): the attribute lists were parsed only after cuLibraryLoadData (the kernel's own, for
    its parameter count) or never (the global .nv.info), so a record running past its section, in a cubin whose
    sha256 matched an edited manifest, was handed to the driver, which reads those lists as it loads."""
    _never_reaches_the_driver(cache, stand_in, _record_past_its_list(record))


def _another_kernels_list(records: bytes):
    """An edit of a cubin's bytes: its 32-byte .nv.callgraph section renamed .nv.info.cgph, in place (13 bytes each),
    and holding ``records``: the attribute list of another kernel than the entry's, as in a cubin of two kernels."""
    def edit(data):
        from runtime.cubin import _section_heads

        heads, shstrndx = _section_heads(bytes(data))
        strtab = heads[shstrndx][4]
        (head,) = [h for h in heads if bytes(data[strtab + h[0] :]).startswith(b".nv.callgraph\0")]
        assert head[5] == len(records) == 32
        data[strtab + head[0] : strtab + head[0] + 13] = b".nv.info.cgph"
        data[head[4] : head[4] + 32] = records
    return edit


@pytest.mark.parametrize("records", [
    b"\x04\x12\x20\x00" + bytes(28),  # a record of 32 bytes in a 32-byte list
    b"\x04\x17\x04\x00" + bytes(4) + b"\x01\x00" * 12,  # a parameter's record of 4 bytes, not 12
], ids=["record past the list", "short parameter record"])
def test_another_kernels_attribute_list_never_reaches_the_driver(cache, stand_in, records):
    """The load's check_section_table walks every attribute list for its bounds but the entry's own, which it
    parses once for the kernel's attributes: a malformed list of another kernel in the same cubin is refused before
    the driver reads it too, not only the global list and the entry's (review-65c)."""
    _never_reaches_the_driver(cache, stand_in, _another_kernels_list(records))


def test_a_capmerc_list_without_its_nv_info_list_is_one_refusal_of_check_cache_and_load(cache, stand_in, monkeypatch):
    """An sm_100a kernel with a capmerc attribute list (.nv.merc.nv.info.<kernel>) and no .nv.info list: its two
    images disagree, a defect of the cubin, refused alike by check_cache and the load (a CubinIntegrityError naming
    the file, the kernel and the rebuild) before the driver sees it. check_cache called it a missing symbol
    (SymbolError): it looked the symbol up in the .nv.info lists before the capmerc list was read."""
    entry = json.loads(manifest_path(cache, "sm_100a").read_text())["kernels"][0]
    rewrite_first_cubin(cache, "sm_100a", sass_list_renamed(entry["symbol"]))
    with pytest.raises(errors.CubinIntegrityError, match="capmerc attribute list .* its .nv.info list nothing") as e:
        manifest_module.check_cache(cache, "sm_100a")
    checked = e.value
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))  # a device sm_100a serves
    drv = stand_in()
    with pytest.raises(errors.CubinIntegrityError) as e:
        loader.load(cache)
    assert str(e.value) == str(checked) and drv.loaded == []
    assert e.value.file == first_cubin(cache, "sm_100a") and e.value.kernel == entry["name"]
    assert e.value.fix.startswith("python build_kernels.py --arch sm_100a")


@pytest.mark.parametrize("edit, said", [
    # It crashed with an AttributeError printing the toolchain.
    (lambda d: d.update(toolchain="12.9"), "fields toolchain have the wrong type"),
    (lambda d: d["kernels"][1].update(smem_bytes=64), "probe_cluster8: the entry differs from this runtime's "
                                                      "contract in smem_bytes"),
])
def test_verify_reports_the_manifests_refusal(cache, stand_in, monkeypatch, capsys, edit, said):
    """python -m runtime verify says FAIL with the reason and exits 1."""
    import runtime.probe
    from runtime import __main__ as cli

    edit_manifest(cache, "sm_90a", edit)
    stand_in()
    monkeypatch.setattr(runtime.probe, "run_probe", lambda loaded: {})
    assert cli.verify(cache) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL: ") and said in out


def test_verify_help_names_the_default_root(capsys):
    """--root's help said the default was the installed cache: it is $SPARSE_DECODE_AOT_CACHE, else the checkout's
    cache, and the installed one only after both (runtime.manifest.default_root)."""
    from runtime import __main__ as cli

    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default: $SPARSE_DECODE_AOT_CACHE, else this checkout's cache, else the installed one" in help_text


def test_verify_passes_a_cache_matching_the_contract(cache, stand_in, monkeypatch, capsys):
    import runtime.probe
    from runtime import __main__ as cli

    stand_in()
    monkeypatch.setattr(runtime.probe, "run_probe", lambda loaded: {"probe_cluster2": None})
    assert cli.verify(cache) == 0
    assert "every entry matches the runtime's contract" in capsys.readouterr().out


def test_verify_fails_where_no_probe_kernel_runs(cache, stand_in, capsys):
    """verify's self-test is the probe kernels: a manifest without them (here an empty list of kernels) launched
    nothing and printed "verify: all checks passed" with exit 0. Now it fails, saying why and the fix."""
    from runtime import __main__ as cli

    edit_manifest(cache, "sm_90a", lambda d: d.update(kernels=[]))
    stand_in()
    assert cli.verify(cache) == 1
    out = capsys.readouterr().out
    assert "probe: FAIL the manifest has no probe kernel" in out and "build_kernels.py --arch sm_90a" in out
    assert out.rstrip().endswith("verify: FAILED")


def test_verify_reports_a_build_that_took_the_lock_after_the_load(cache, stand_in, monkeypatch, capsys):
    """verify's second read (the ELF sections, under the build lock) may meet a build that started after its load: a
    FAIL line naming it and exit 1, not a traceback."""
    import runtime.manifest
    from runtime import __main__ as cli

    def build_holds_the_lock(root, arch):
        raise errors.CacheLoadInterrupted("a build has been writing this cache", fix="verify again")

    stand_in()
    monkeypatch.setattr(runtime.manifest, "check_cache", build_holds_the_lock)
    assert cli.verify(cache) == 1
    assert capsys.readouterr().out.startswith("FAIL (ELF sections): a build has been writing this cache")


def test_load_waits_for_a_build_writing_the_cache(cache, stand_in, monkeypatch):
    """runtime.load reads the manifest and the cubins under the build lock (shared): while a build holds it, the
    load raises CacheLoadInterrupted after its wait (not a refusal), and loads once the build is done."""
    import functools

    from filelock import FileLock

    from runtime import manifest
    from runtime.errors import CacheLoadInterrupted

    stand_in()
    monkeypatch.setattr(loader, "build_settled", functools.partial(manifest.build_settled, wait_s=0.05))
    with FileLock(str(cache / manifest.BUILD_LOCK)):
        with pytest.raises(CacheLoadInterrupted, match="a build has been writing this cache"):
            loader.load(cache)
    assert set(loader.load(cache).names()) == {"probe_cluster2", "probe_cluster8"}


@pytest.fixture
def ops_binding(monkeypatch):
    """The host ops' binding as a fresh process has it: runtime.load is the loader's own (not a test's stand-in),
    no device bound, no fallback said."""
    import runtime

    monkeypatch.setattr(runtime, "load", loader.load)
    monkeypatch.setattr(loader, "_bound", {})
    monkeypatch.setattr(loader, "_refusals_said", set())


def test_a_refused_cache_root_is_a_refusal_not_an_error_of_every_call(stand_in, monkeypatch, ops_binding):
    """A relative $SPARSE_DECODE_AOT_CACHE is a PathError (a CacheError): the ops run their fallback and say so once,
    as for every refusal. The root's check in is_loaded ran outside the refusal's handling, so every op call raised
    it instead."""
    from runtime.manifest import CACHE_ROOT_ENV

    drv = stand_in()
    monkeypatch.setenv(CACHE_ROOT_ENV, "relative/cache")
    with pytest.warns(RuntimeWarning, match="PathError.*relative path 'relative/cache'"):
        assert loader.cache_or_fallback("decode_topk", 0) is None
    assert isinstance(_refusal_of(0), errors.PathError) and not drv.loaded
    assert loader.cache_or_fallback("decode_topk", 0) is None  # remembered: not read again, not said again


def test_a_cache_root_that_is_a_symlink_loop_is_a_refusal(tmp_path, stand_in, monkeypatch, ops_binding):
    """$SPARSE_DECODE_AOT_CACHE naming a symlink loop: pathlib's RuntimeError (Python < 3.13) escaped from every op
    call, not a refusal; now a PathError naming the root, remembered, the fallback said once."""
    from runtime.manifest import CACHE_ROOT_ENV, check_cache

    drv = stand_in()
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    monkeypatch.setenv(CACHE_ROOT_ENV, str(tmp_path / "a"))
    # A PathError where pathlib finds the loop (before Python 3.13), else the manifest's SchemaError (ELOOP).
    with pytest.raises(errors.CacheError, match="cannot be resolved|not readable JSON"):
        check_cache()
    with pytest.warns(RuntimeWarning, match="cannot serve cuda:0.*(PathError|SchemaError)"):
        assert loader.cache_or_fallback("decode_topk", 0) is None
    assert loader.cache_or_fallback("decode_topk", 0) is None and not drv.loaded


def test_the_first_call_binds_the_device_for_every_op(cache, tmp_path, stand_in, monkeypatch, ops_binding):
    """The host ops bind a device at their first call there, to the cache root of that moment or its refusal, and
    keep it: the ops' own memos (decode_topk's plans, sparse MLA's kernels) are keyed by device, so a refusal memo
    keyed by root as well let a later root serve one op while another kept the first root's answer. Now every op
    answers alike on the device, read once and said once an op, for the life of the process: a runtime.load() that
    succeeds on the root set since changes nothing for the ops (their memos hold the first answer)."""
    import warnings

    import runtime
    from runtime.manifest import CACHE_ROOT_ENV

    drv = stand_in()
    empty = tmp_path / "not_built"
    empty.mkdir()
    monkeypatch.setenv(CACHE_ROOT_ENV, str(empty))
    with pytest.warns(RuntimeWarning, match="decode_topk: .*SchemaError.*not_built.*manifest not found"):
        assert loader.cache_or_fallback("decode_topk", 0) is None
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))
    with pytest.warns(RuntimeWarning, match="sparse_mla_decode: .*SchemaError.*not_built"):  # said once for each op
        assert loader.cache_or_fallback("sparse_mla_decode", 0) is None  # the bound refusal: the root is not read
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loader.cache_or_fallback("decode_topk", 0) is None  # and not said again for this op
    assert not drv.loaded
    assert "probe_cluster2" in runtime.load(device=0)  # the root set since loads, for direct launches
    assert loader.cache_or_fallback("decode_topk", 0) is None
    assert loader.cache_or_fallback("sparse_mla_decode", 0) is None


def test_a_start_up_load_binds_the_ops_to_its_cache_or_refusal(cache, tmp_path, stand_in, monkeypatch, ops_binding):
    """runtime.load(device=i) at start-up, before any graph capture, as the README says: where it is refused (a GPU
    no cache arch serves, an unbuilt root) the ops' first call inside a capture used to find nothing loaded and
    nothing refused and raised CacheLoadInterrupted, whose fix is the load that was made. Now the refusal is bound,
    and the first call runs the fallback, saying why once, without asking about capture. A load of another root
    (root given) binds nothing: the ops read $SPARSE_DECODE_AOT_CACHE or the default root only."""
    import runtime
    from runtime.manifest import CACHE_ROOT_ENV

    stand_in()
    empty = tmp_path / "not_built"
    empty.mkdir()
    monkeypatch.setenv(CACHE_ROOT_ENV, str(empty))
    loader.load(cache, device=0)
    assert loader._bound == {}
    with pytest.raises(errors.SchemaError, match="manifest not found"):
        runtime.load(device=0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: pytest.fail("asked about capture"))
    with pytest.warns(RuntimeWarning, match="decode_topk: the AOT cache cannot serve cuda:0.*SchemaError"):
        assert loader.cache_or_fallback("decode_topk", 0) is None
    assert isinstance(_refusal_of(0), errors.SchemaError)


def test_a_gpu_no_arch_serves_takes_the_fallback_at_a_first_call_inside_a_capture(cache, stand_in, monkeypatch,
                                                                                   ops_binding):
    """A GPU of compute capability 8.0 (or 10.3) is refused by its capability alone, which torch's device properties
    give without a CUDA call: a first op call inside a graph capture binds that refusal and runs the fallback, as it
    would outside one, instead of raising CacheLoadInterrupted for a load that could never serve the device."""
    from runtime.manifest import CACHE_ROOT_ENV

    drv = stand_in()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.warns(RuntimeWarning, match="sparse_mla_decode: the AOT cache cannot serve cuda:0.*DeviceArchError"
                                            ".*compute capability 8.0"):
        assert loader.cache_or_fallback("sparse_mla_decode", 0) is None
    assert isinstance(_refusal_of(0), errors.DeviceArchError) and not drv.loaded


def test_a_start_up_load_stopped_by_the_process_state_binds_nothing(cache, stand_in, monkeypatch, ops_binding):
    """Out of GPU memory at a start-up runtime.load(): CacheLoadInterrupted reaches the caller and nothing is bound
    (the state passes; the ops' first call loads again), where a refused root, such as a relative
    $SPARSE_DECODE_AOT_CACHE, is bound as any refusal."""
    import runtime
    from runtime.manifest import CACHE_ROOT_ENV

    drv = stand_in(load_error=real.CUresult.CUDA_ERROR_OUT_OF_MEMORY)
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))
    with pytest.raises(errors.CacheLoadInterrupted, match="out of memory"):
        runtime.load(device=0)
    assert loader._bound == {}
    drv.load_error = None
    assert "probe_cluster2" in loader.cache_or_fallback("decode_topk", 0)
    monkeypatch.setattr(loader, "_bound", {})
    monkeypatch.setenv(CACHE_ROOT_ENV, "relative/cache")
    with pytest.raises(errors.PathError):
        runtime.load(device=0)
    assert isinstance(_refusal_of(0), errors.PathError)


@pytest.mark.parametrize("refused", [False, True], ids=["served", "refused"])
def test_an_op_and_a_start_up_load_racing_bind_one_answer_without_deadlock(cache, tmp_path, stand_in, monkeypatch,
                                                                        refused):
    """An op's first call takes the binding lock, then the load's; runtime.load() takes the load's and binds after
    releasing it. Racing from two threads, both end, and both see the one bound answer."""
    import threading

    import runtime
    from runtime.manifest import CACHE_ROOT_ENV

    stand_in()
    monkeypatch.setattr(runtime, "load", loader.load)
    monkeypatch.setattr(loader, "_refusals_said", set())
    root = tmp_path / "not_built" if refused else cache
    root.mkdir(exist_ok=True)
    monkeypatch.setenv(CACHE_ROOT_ENV, str(root))
    for _ in range(20):
        monkeypatch.setattr(loader, "_bound", {})
        monkeypatch.setattr(loader, "_caches", {})
        answers, start = {}, threading.Barrier(2)

        def op(answers=answers, start=start):
            start.wait()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                answers["op"] = loader.cache_or_fallback("decode_topk", 0)

        def load(answers=answers, start=start):
            start.wait()
            try:
                answers["load"] = runtime.load(device=0)
            except errors.CacheError as e:
                answers["load"] = e

        threads = [threading.Thread(target=op, daemon=True), threading.Thread(target=load, daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads), "deadlock"
        bound = loader._bound[0]
        assert isinstance(bound, errors.CacheError) == refused
        assert answers["op"] is (None if refused else bound)
        if not refused:
            assert answers["load"] is bound


def test_a_bound_cache_is_not_replaced_by_a_later_load(cache, stand_in, monkeypatch, ops_binding):
    """Once the ops run a cache's kernels on a device (graphs may hold them), a later runtime.load() of the root, set
    to another cache since or refused now, changes nothing for them."""
    import runtime
    from runtime.manifest import CACHE_ROOT_ENV

    stand_in()
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache))
    bound = loader.cache_or_fallback("decode_topk", 0)
    monkeypatch.setenv(CACHE_ROOT_ENV, str(cache / "elsewhere"))
    with pytest.raises(errors.SchemaError):
        runtime.load(device=0)
    assert loader.cache_or_fallback("sparse_mla_decode", 0) is bound


class _KernelsOfAnotherFamily:
    """A loaded cache (a partial manifest) that holds none of the ops' kernels."""

    arch = "sm_90a"

    def __contains__(self, name):
        return False

    def kernel(self, name):
        raise AssertionError(f"asked for {name}, which it does not hold")


@pytest.fixture
def partial_cache(monkeypatch):
    """The host ops' cache answer replaced by _KernelsOfAnotherFamily, their memos fresh."""
    from runtime import loader, sparse_mla, topk

    partial = _KernelsOfAnotherFamily()
    monkeypatch.setattr(loader, "cache_or_fallback", lambda op, index: partial)  # held_kernel's (sparse_mla_decode)
    monkeypatch.setattr(topk, "cache_or_fallback", lambda op, index: partial)
    monkeypatch.setattr(sparse_mla, "_kernels", {})
    monkeypatch.setattr(topk, "_plans", {})
    return partial


def test_a_loaded_cache_without_an_ops_kernels_says_that_the_fallback_runs(partial_cache):
    """A manifest may hold part of the contract (a build with --only, a trimmed cache): it loads, and an op whose
    kernel it lacks ran its torch fallback (milliseconds) without a word, where every other reason says so once."""
    import re
    import warnings

    from runtime import sparse_mla, topk
    from runtime.contract import decode_topk as topk_contract
    from runtime.contract import sparse_mla_decode as mla_contract

    cuda0 = torch.device("cuda", 0)
    name = mla_contract.variant_name(640, True)
    with pytest.warns(RuntimeWarning, match=f"sparse_mla_decode: the AOT cache loaded for cuda:0 has no kernel "
                                            f"{name}") as mla_said:
        assert sparse_mla._kernel(640, True, cuda0) is None
    first = topk_contract.name_for("f32", False, topk_contract.CLUSTERS[0])
    with pytest.warns(RuntimeWarning, match=f"decode_topk: the AOT cache loaded for cuda:0 has no kernel "
                                            f"{re.escape(first)}, .*rebuild the cache") as topk_said:
        assert topk._plan_for(cuda0, "f32", False) is None
    assert [w.filename for w in (*mla_said, *topk_said)] == [__file__] * 2, "the warnings name the caller's line"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the memos keep the answers
        assert sparse_mla._kernel(640, True, cuda0) is None and topk._plan_for(cuda0, "f32", False) is None


def test_an_op_without_a_kernel_for_the_arch_says_no_rebuild_adds_one(partial_cache):
    """Sparse MLA's kernel is built for sm_90a only (the contract defines it for no other arch): on a Blackwell
    device its warning told the user to rebuild the cache, which cannot add it. It now names the arch it is built
    for; decode_topk, which the contract defines for sm_100a, still says to rebuild."""
    import re

    from runtime import sparse_mla, topk
    from runtime.contract import decode_topk as topk_contract
    from runtime.contract import sparse_mla_decode as mla_contract

    partial_cache.arch = "sm_100a"
    cuda0 = torch.device("cuda", 0)
    name = mla_contract.variant_name(128, False)
    with pytest.warns(RuntimeWarning) as said:
        assert sparse_mla._kernel(128, False, cuda0) is None
    expected = (f"sparse_mla_decode: {name} is built for sm_90a only, not for cuda:0's sm_100a, so the exact torch "
                f"fallback runs instead (milliseconds, not microseconds)")
    assert [str(w.message) for w in said] == [expected]
    first = topk_contract.name_for("bf16", True, topk_contract.CLUSTERS[0])
    with pytest.warns(RuntimeWarning, match=f"decode_topk: the AOT cache loaded for cuda:0 has no kernel "
                                            f"{re.escape(first)}, .*rebuild the cache"):
        assert topk._plan_for(cuda0, "bf16", True) is None


def test_max_tokens_on_a_cache_of_one_sparse_mla_variant_says_nothing(monkeypatch):
    """max_tokens asked for the sinks variant first through the ops' memo: on a cache holding only the _nosinks one
    (a build with --only) it warned that the torch fallback runs, where no op ran, and the memo then kept the
    answer, so the op's own call with sinks fell back without a word. It now asks the cache: no warning, the
    variant's occupancy, and the op's first call with sinks is the one that says so."""
    import warnings

    from runtime import loader, sparse_mla
    from runtime.contract import sparse_mla_decode as mla_contract

    class _OneVariant(_KernelsOfAnotherFamily):
        held = mla_contract.variant_name(640, False)

        def __contains__(self, name):
            return name == self.held

        def kernel(self, name):
            assert name == self.held
            return type("K", (), {"max_active_clusters": 52})()

    one = _OneVariant()
    monkeypatch.setattr(loader, "cache_or_fallback", lambda op, index: one)
    monkeypatch.setattr(sparse_mla, "_kernels", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sparse_mla.max_tokens(640, "cuda:0") == 52
        assert sparse_mla.max_tokens(128, "cuda:0") == 0  # neither variant held
    assert sparse_mla._kernels == {}
    with pytest.warns(RuntimeWarning, match=f"has no kernel {mla_contract.variant_name(640, True)}"):
        assert sparse_mla._kernel(640, True, torch.device("cuda", 0)) is None


def test_a_missing_kernel_is_said_once_where_warnings_are_errors(partial_cache):
    """Where warnings are errors (pytest -W error, a strict service), the partial manifest's warning is raised by the
    first call only, as a refusal's is (cache_or_fallback marks it said before it warns): the answer is memoized
    before the warning, not after it, so later calls run the fallback instead of raising every time."""
    import warnings

    from runtime import sparse_mla, topk

    cuda0 = torch.device("cuda", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="has no kernel"):
            sparse_mla._kernel(640, True, cuda0)
        with pytest.raises(RuntimeWarning, match="has no kernel"):
            topk._plan_for(cuda0, "f32", False)
        assert sparse_mla._kernel(640, True, cuda0) is None and topk._plan_for(cuda0, "f32", False) is None


def _packed_values(kernel) -> list:
    """What the launch's void* array points at, read back as each parameter's C type."""
    ctypes_of = {"void*": ctypes.c_uint64, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
                 "float": ctypes.c_float, "int64_t": ctypes.c_int64}
    return [ctypes_of[p.ctype].from_address(kernel._pointers[i]).value for i, p in enumerate(kernel.entry.params)]


def test_argument_block_lays_every_c_type_at_its_alignment():
    """Each argument at an address aligned to its size, inside the one buffer, and read back as packed."""
    from runtime.manifest import ParamEntry

    params = tuple(ParamEntry(f"p{i}", ctype, 0, 0) for i, ctype in
                   enumerate(("int32_t", "void*", "float", "int64_t", "uint32_t", "int32_t", "void*")))
    pack, buffer, pointers = loader._argument_block(params)
    values = (-2 ** 31, 2 ** 64 - 1, 0.5, -2 ** 63, 2 ** 32 - 1, 2 ** 31 - 1, 0)
    pack(buffer, 0, *values)
    base, sizes = ctypes.addressof(buffer), {"int32_t": 4, "uint32_t": 4, "float": 4, "void*": 8, "int64_t": 8}
    for param, address in zip(params, pointers):
        assert address % sizes[param.ctype] == 0 and base <= address <= base + len(buffer) - sizes[param.ctype]
    kernel = types.SimpleNamespace(_pointers=pointers, entry=types.SimpleNamespace(params=params))
    assert _packed_values(kernel) == list(values)
    assert len({*pointers}) == len(params), "no two arguments share storage"


def test_launch_refuses_a_value_its_c_type_cannot_hold(cache, stand_in):
    """ctypes wrapped an int past int32 (2**31 became -2**31) and a negative pointer into a huge address, and the kernel
    ran with it. Every argument is now range-checked as it is packed: a ValueError naming the argument, or a TypeError
    for a value of the wrong kind, and no launch; the next good launch packs every argument again."""
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster2")
    launched = _recording_launches(kernel)
    assert [(p.name, p.ctype) for p in kernel.entry.params] == [("out", "void*"), ("seed", "int32_t")]
    for args, exc, match in (((0, 2 ** 31), ValueError, r"argument seed \(int32_t\) = 2147483648 is out of"),
                             ((0, -2 ** 31 - 1), ValueError, r"argument seed \(int32_t\)"),
                             ((-1, 0), ValueError, r"argument out \(void\*\) = -1 .*pointer"),
                             ((2 ** 64, 0), ValueError, r"argument out \(void\*\)"),
                             ((0, 1.5), TypeError, r"argument seed \(int32_t\) got float 1.5; pass an int"),
                             (("0", 1), TypeError, r"argument out \(void\*\) got str"),
                             ((0,), TypeError, r"takes 2 arguments \(out, seed\), got 1"),
                             ((0, 1, 2), TypeError, r"takes 2 arguments")):
        with pytest.raises(exc, match=rf"^probe_cluster2: {match}"):
            kernel.launch(2, *args, stream=5)
    assert not launched
    kernel.launch(2, 2 ** 64 - 1, -2 ** 31, stream=5)
    assert _packed_values(kernel) == [2 ** 64 - 1, -2 ** 31] and launched == [5]
    kernel.launch(2, 4096, 7, stream=5)
    assert _packed_values(kernel) == [4096, 7]


def test_a_tensor_passed_for_an_argument_is_named_as_a_tensor_without_reading_it(cache, stand_in):
    """A tensor passed where its data_ptr() belongs was said to be 'out of its C type's range' (it has __index__),
    its repr in the message: a device tensor's repr copies its values back, which waits for the GPU and fails inside
    a CUDA-graph capture with the capture's error instead of this one. Now a TypeError naming the fix, no repr."""
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster2")
    launched = _recording_launches(kernel)

    class Unreadable(torch.Tensor):  # a device tensor's values cannot be read here
        def __repr__(self):
            raise AssertionError("the refusal read the tensor's values")

    out = torch.zeros(4, dtype=torch.int32).as_subclass(Unreadable)
    _refused_as_a_tensor(kernel, out)
    # nor in a grid of the wrong length (its repr was in the message)
    with pytest.raises(TypeError, match=r"^probe_cluster2: grid \(Unreadable, int\) must be an int or three ints"):
        kernel.launch((out[:1], 1), 0, 7, stream=5)
    assert not launched


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_a_one_element_tensor_is_refused_as_an_argument_without_reading_it(cache, stand_in, dtype):
    """A tensor of one element packed as its value (its __index__): for a pointer the kernel launched at address 5
    (an illegal address, the context unusable), for a number its value was read (a device tensor's waits for the
    GPU; inside a capture torch's RuntimeError escaped). Refused as any tensor is, its value unread."""
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster2")
    launched = _recording_launches(kernel)

    class Unreadable(torch.Tensor):  # a capturing device tensor's values cannot be read
        def __index__(self):
            raise RuntimeError("operation not permitted when stream is capturing")

        __int__ = __float__ = __repr__ = __index__

    class Plain(torch.Tensor):  # a subclass whose __index__ reads the value as a plain tensor's does
        pass

    for cls in (torch.Tensor, Plain, Unreadable, torch.nn.Parameter):
        _refused_as_a_tensor(kernel, torch.tensor([5], dtype=dtype).as_subclass(cls))
    assert not launched


def _refused_as_a_tensor(kernel, value: torch.Tensor) -> None:
    """probe_cluster2's pointer and its int32 seed each refuse ``value`` as a tensor, its type and shape named with
    the fix, none of its values read."""
    shown = f"{type(value).__name__} of shape \\({value.shape[0]},\\) on cpu"
    pointer, seed = r"^probe_cluster2: argument out \(void\*\)", r"^probe_cluster2: argument seed \(int32_t\)"
    with pytest.raises(TypeError, match=rf"{pointer} got a {shown}; pass out\.data_ptr\(\)$"):
        kernel.launch(2, value, 7, stream=5)
    with pytest.raises(TypeError, match=rf"{seed} got a {shown}; pass a Python int$"):
        kernel.launch(2, 0, value, stream=5)


def test_float_arguments_pack_as_c_converts_them():
    """A float past float32's range packs as inf (as ctypes and C's conversion do); an int too large for a double and a
    value that is no number are refused, naming the argument."""
    from runtime.manifest import ParamEntry

    entry = types.SimpleNamespace(name="k", params=(ParamEntry("scale", "float", 0, 4),))
    kernel = types.SimpleNamespace(name="k", entry=entry)
    error = loader.Kernel._refused_arguments(kernel, (10 ** 400,))
    assert isinstance(error, ValueError) and "argument scale (float) = 1000" in str(error)
    error = loader.Kernel._refused_arguments(kernel, (None,))
    assert isinstance(error, TypeError) and "got NoneType None; pass a number" in str(error)
    pack, buffer, pointers = loader._argument_block(entry.params)
    for value, packed in ((1e39, float("inf")), (-1e39, float("-inf")), (3, 3.0), (0.1, ctypes.c_float(0.1).value)):
        pack(buffer, 0, value)
        assert ctypes.c_float.from_address(pointers[0]).value == packed


@pytest.mark.parametrize("error", [errors.DriverRefusedError("launch refused", kernel="probe_cluster2"),
                                   RuntimeError("CUDA error: an illegal memory access was encountered")],
                         ids=["refused", "faulted"])
def test_verify_reports_a_probe_that_fails_to_run(cache, stand_in, monkeypatch, capsys, error):
    """A probe launch the driver refuses, or one that faults (torch raises at the synchronize), ended verify with a
    traceback: now a FAIL line naming the error, "verify: FAILED" and exit 1."""
    import runtime.probe
    from runtime import __main__ as cli

    def failing_probe(loaded):
        raise error

    stand_in()
    monkeypatch.setattr(runtime.probe, "run_probe", failing_probe)
    assert cli.verify(cache) == 1
    out = capsys.readouterr().out
    assert f"probe: FAIL {type(error).__name__}: " in out and str(error) in out
    assert out.rstrip().endswith("verify: FAILED")


# --- sixty-fourth session review (review-64a): verify's CLI, the probe's arithmetic, driver and error helpers --------

def test_verify_fails_where_a_probe_reports_a_mismatch(cache, stand_in, monkeypatch, capsys):
    """A probe that ran and left other words than expected (the words a PDL ordering fault leaves) is a FAIL line
    naming what differs, and exit 1; the other probe's ok line still prints."""
    import runtime.probe
    from runtime import __main__ as cli

    stand_in()
    monkeypatch.setattr(runtime.probe, "run_probe",
                        lambda loaded: {"probe_cluster2": None, "probe_cluster8": "wrote [1], expected [2]"})
    assert cli.verify(cache) == 1
    out = capsys.readouterr().out
    assert f"  probe probe_cluster2: {cli.PROBE_OK}\n" in out
    assert "  probe probe_cluster8: FAIL wrote [1], expected [2]\n" in out and out.endswith("verify: FAILED\n")


def test_verify_fails_while_a_build_holds_the_lock(cache, stand_in, monkeypatch, capsys):
    """A load stopped by a build writing the cache (CacheLoadInterrupted: a RuntimeError, not a CacheError) is a
    FAIL line and exit 1, not a traceback."""
    import functools

    from filelock import FileLock

    from runtime import __main__ as cli
    from runtime import manifest

    stand_in()
    monkeypatch.setattr(loader, "build_settled", functools.partial(manifest.build_settled, wait_s=0.05))
    with FileLock(str(cache / manifest.BUILD_LOCK)):
        assert cli.verify(cache) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL: ") and "a build has been writing this cache" in out


def test_python_m_runtime_verify_takes_root(cache, stand_in, monkeypatch, capsys):
    """``python -m runtime verify --root DIR`` verifies that cache, not the installed one."""
    import runtime.probe
    from runtime import __main__ as cli

    stand_in()
    monkeypatch.setattr(runtime.probe, "run_probe", lambda loaded: {"probe_cluster2": None})
    assert cli.main(["verify", "--root", str(cache)]) == 0
    assert f"manifest {manifest_path(cache, 'sm_90a')} (arch sm_90a" in capsys.readouterr().out


def _probe_words(cluster, clusters, seed, previous):
    """What the probe kernel (kernels/probe.py) leaves, written from its own description: the CTA of cluster rank r
    and block b sends 1000 * (r + 1) + b to rank r + 1 of its cluster (mod the cluster), and each CTA adds the word
    it receives and the seed to its word of out."""
    received = [0] * (cluster * clusters)
    for block in range(cluster * clusters):
        rank = block % cluster
        received[block - rank + (rank + 1) % cluster] = 1000 * (rank + 1) + block
    return [r + seed + p for r, p in zip(received, previous)]


def test_expected_probe_output_is_what_the_kernel_computes():
    from runtime.probe import expected_probe_output

    assert expected_probe_output(2, 2, 5) == [2006, 1005, 2008, 1007]  # by hand: rank 0 hears from rank 1
    for cluster in (2, 8, 16):
        previous = list(range(cluster * 3))
        assert expected_probe_output(cluster, 3, 9, previous) == _probe_words(cluster, 3, 9, previous), cluster


class _ProbeKernel:
    """A probe kernel run on the CPU over a tensor's words; ``ordered=False``: the second launch of a pair read out
    before the first's writes (what a PDL ordering fault leaves)."""

    def __init__(self, cluster, buffers, ordered=True, current=lambda: None):
        self.entry = types.SimpleNamespace(cluster=(cluster, 1, 1))
        self.buffers, self.ordered, self.launches = buffers, ordered, []
        self.current, self.launched_on = current, []

    def launch(self, grid, pointer, seed):
        self.launches.append((grid, seed))
        self.launched_on.append(self.current())  # the device current at the launch (its stream's)
        out = next(b for b in self.buffers if b.data_ptr() == pointer)
        first_of_pair = len(self.launches) % 2 == 1
        previous = out.tolist() if self.ordered or first_of_pair else [0] * grid
        out.copy_(torch.tensor(_probe_words(self.entry.cluster[0], grid // self.entry.cluster[0], seed, previous)))


@pytest.fixture
def cpu_probe(monkeypatch):
    """run_probe on the CPU: its buffers are CPU tensors (recorded), the GPU spin and synchronize are recorded, each
    with the CUDA device it used (torch.cuda.device stood in; cuda:0 current); ``device``: the cache's."""
    import runtime.probe

    buffers, events = [], []
    current = {"index": 0}
    real_zeros = torch.zeros
    def zeros(*args, device=None, **kwargs):
        index = torch.device(device).index
        events.append(("zeros", current["index"] if index is None else index))  # "cuda": the current device
        buffers.append(real_zeros(*args, **kwargs))
        return buffers[-1]

    monkeypatch.setattr(torch, "zeros", zeros)
    monkeypatch.setattr(torch.cuda, "device", _device_stand_in(current))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: events.append(("spin", cycles, current["index"])),
                        raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(
        ("sync", current["index"] if device is None else torch.device("cuda", device).index)))

    def run(ordered_by_name, device=0):
        kernels = {name: _ProbeKernel(int(name.removeprefix("probe_cluster")), buffers, ordered,
                                      lambda: current["index"])
                   for name, ordered in ordered_by_name.items()}
        cache = types.SimpleNamespace(names=lambda family=None: list(kernels), kernel=kernels.__getitem__,
                                      device=device)
        results = runtime.probe.run_probe(cache)
        assert current["index"] == 0, "the process's current device is left as it was"
        return results, kernels, events

    return run


def test_run_probe_launches_each_pair_after_a_spin_and_passes_the_right_words(cpu_probe):
    """Each probe variant: PROBE_PAIRS pairs of launches of cluster * CLUSTERS_PER_LAUNCH CTAs on one zeroed buffer,
    seeds seed, seed + 1 then the next two, each pair queued behind the GPU spin and synchronized."""
    from runtime.probe import CLUSTERS_PER_LAUNCH, PROBE_PAIRS, QUEUE_SPIN_CYCLES

    results, kernels, events = cpu_probe({"probe_cluster2": True, "probe_cluster8": True})
    assert results == {"probe_cluster2": None, "probe_cluster8": None}
    assert kernels["probe_cluster8"].launches == [(8 * CLUSTERS_PER_LAUNCH, 7 + s) for s in range(2 * PROBE_PAIRS)]
    assert events == [("zeros", 0), ("spin", QUEUE_SPIN_CYCLES, 0), ("sync", 0)] * (2 * PROBE_PAIRS)


def test_run_probe_runs_on_the_caches_device(cpu_probe):
    """A cache loaded for cuda:1 (runtime.load(device=1)) while cuda:0 is current: run_probe zeroed its buffer, spun
    and synchronized on cuda:0 and launched there, which Kernel.launch refuses (a kernel belongs to the device it was
    loaded for), so it could not probe that cache. Every step runs with the cache's device current."""
    results, kernels, events = cpu_probe({"probe_cluster2": True}, device=1)
    assert results == {"probe_cluster2": None}
    assert kernels["probe_cluster2"].launched_on == [1] * len(kernels["probe_cluster2"].launches)
    assert {event[-1] for event in events} == {1}, events


def test_run_probe_names_the_ctas_a_second_launch_ran_ahead_of(cpu_probe):
    """A pair whose second launch read out before the first wrote it is a problem naming those CTAs; that variant
    stops at its first such pair, the others run on."""
    results, kernels, _ = cpu_probe({"probe_cluster2": False, "probe_cluster8": True})
    assert results["probe_cluster8"] is None and len(kernels["probe_cluster2"].launches) == 2
    assert results["probe_cluster2"].startswith("wrote [2009, 1008, 2011, 1010, 2013, 1012, 2015, 1014], expected "
                                                "[4017, 2015, 4021, 2019, ")  # seeds 7 then 8: words 2001 + 7 + 8
    assert "; CTAs [0, 1, 2, 3, 4, 5, 6, 7] of the second launch read out before the first launch's writes" in \
        results["probe_cluster2"]


def test_a_pair_whose_first_launch_wrote_last_is_named_too():
    """The race's other outcome: the first launch's writes landed after the second's (the first's words are left).
    Words that match neither outcome are a mismatch without the ordering diagnosis."""
    from runtime.probe import CLUSTERS_PER_LAUNCH, _pair_problem, expected_probe_output

    first = expected_probe_output(2, CLUSTERS_PER_LAUNCH, 3)
    assert "CTAs [0, 1, 2, 3, 4, 5, 6, 7] of the second launch read out before" in _pair_problem(first, 2, 3)
    assert _pair_problem([-1] * 8, 2, 3) == f"wrote {[-1] * 8}, expected " \
                                            f"{expected_probe_output(2, CLUSTERS_PER_LAUNCH, 4, first)}"


def test_a_driver_that_cannot_initialise_is_a_no_driver_error(monkeypatch):
    """cuInit returning an error (a GPU machine with no device visible, or a driver that failed) is a NoDriverError
    naming that error and the fix, and the driver module is not kept as initialised."""
    import runtime.driver

    monkeypatch.setattr(runtime.driver, "_driver", None)
    monkeypatch.setattr(real, "cuInit", lambda flags: (real.CUresult.CUDA_ERROR_NO_DEVICE,))
    with pytest.raises(errors.NoDriverError, match=r"cannot initialise \(CUDA_ERROR_NO_DEVICE\).*Fix: run on a"):
        runtime.driver.driver()
    assert runtime.driver._driver is None
    # a CacheError: cache_or_fallback binds it as the device's refusal (the ops warn and fall back) and
    # `runtime verify` reports it, where any other class would escape both as a traceback
    assert issubclass(errors.NoDriverError, errors.CacheError)
    monkeypatch.setattr(real, "cuInit", lambda flags: (OK,))
    assert runtime.driver.driver() is real and runtime.driver._driver is real


def test_check_unpacks_a_result_and_raises_on_any_error(stand_in):
    """runtime.driver.check: nothing, one value or a tuple of the values after CUDA_SUCCESS; any other result (the
    first error code, 1, included) a CudaCallError naming the call, the error and the driver's text."""
    from runtime.driver import CudaCallError, check

    stand_in()
    assert check((OK,), "cuA") is None and check(OK, "cuA") is None
    assert check((OK, 5), "cuB") == 5 and check((OK, 5, 6), "cuC") == (5, 6)
    with pytest.raises(CudaCallError) as failed:
        check((real.CUresult.CUDA_ERROR_INVALID_VALUE, 0), "cuD")
    assert str(failed.value) == "cuD failed: CUDA_ERROR_INVALID_VALUE (stand-in driver error)"
    assert failed.value.result == real.CUresult.CUDA_ERROR_INVALID_VALUE


def test_an_unknown_kernel_is_a_key_error_and_a_cache_error(cache, stand_in):
    """Loaded.kernel(name) of a name the cache lacks: an UnknownKernelError, caught as KeyError (a mapping's miss)
    and as CacheError, whose text is its message (KeyError's str would quote it)."""
    stand_in()
    loaded = loader.load(cache)
    with pytest.raises(KeyError) as missed:
        loaded.kernel("no_such_kernel")
    assert isinstance(missed.value, errors.UnknownKernelError) and isinstance(missed.value, errors.CacheError)
    assert not str(missed.value).startswith(("'", '"')) and "no_such_kernel" in str(missed.value)


# --- sixty-eighth session: `verify --files-only`, the cache's own checks where no GPU or driver is -------------------

@pytest.fixture
def no_driver(monkeypatch):
    """The driver as on CI: any call of runtime.driver.driver() raises NoDriverError (and would fail a test that
    expects none)."""
    import runtime.driver

    def refuse():
        raise errors.NoDriverError("no CUDA driver on this machine (test).", fix="run on a GPU")

    monkeypatch.setattr(runtime.driver, "driver", refuse)
    monkeypatch.setattr(loader, "driver", refuse)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_verify_files_only_checks_every_arch_without_a_driver(cache, no_driver, capsys):
    """Without a GPU, verify stopped at the driver: an image build or a CPU-only host could not check the cache it
    ships. --files-only runs every check a load makes before the driver, for each arch with a manifest."""
    from runtime import __main__ as cli

    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 0
    out = capsys.readouterr().out
    for arch in ("sm_90a", "sm_100a"):
        assert f"ok {arch}: manifest {manifest_path(cache, arch)} (schema ok" in out
    assert "2 kernels: every entry matches the runtime's contract" in out
    assert out.rstrip().splitlines()[-1].startswith("verify --files-only: all checks passed (no device checked")


def test_verify_files_only_fails_a_root_it_cannot_list(tmp_path, no_driver, capsys):
    """Listing manifests/ for archs this runtime does not know raised OSError (a traceback) for a root whose name is
    too long; each arch's check now says why it cannot read the cache, exit 1."""
    from runtime import __main__ as cli

    assert cli.main(["verify", "--files-only", "--root", str(tmp_path / ("a" * 300))]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "File name too long" in out, out
    assert out.rstrip().endswith("verify --files-only: FAILED")


@pytest.mark.parametrize("damage, said", [
    (lambda cubin: cubin.write_bytes(cubin.read_bytes()[:-1]), "bytes, the manifest says"),
    (lambda cubin: cubin.write_bytes(cubin.read_bytes()[:-1] + b"\x01"), "cubin sha256 does not match"),
    (lambda cubin: cubin.unlink(), "cubin is missing"),
])
def test_verify_files_only_fails_an_arch_whose_cubin_is_damaged(cache, no_driver, capsys, damage, said):
    """A damaged cubin of one arch fails that arch (its reason and fix), the other arch is still checked, exit 1."""
    from runtime import __main__ as cli

    damage(first_cubin(cache, "sm_100a"))
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 1
    out = capsys.readouterr().out
    assert f"ok sm_90a: manifest {manifest_path(cache, 'sm_90a')}" in out
    failed = [line for line in out.splitlines() if line.startswith("FAIL sm_100a: ")]
    assert len(failed) == 1 and said in failed[0] and "python build_kernels.py --arch sm_100a" in failed[0]
    assert out.rstrip().endswith("verify --files-only: FAILED")


def test_verify_files_only_fails_a_manifest_of_no_kernel(cache, no_driver, capsys):
    """'"kernels": []' passed with "0 kernels" and "all checks passed", for a cache that serves nothing (no build
    writes one: --only keeps the other entries). It fails that arch, naming the rebuild."""
    from runtime import __main__ as cli

    edit_manifest(cache, "sm_100a", lambda d: d.update(kernels=[]))
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 1
    out = capsys.readouterr().out
    assert f"ok sm_90a: manifest {manifest_path(cache, 'sm_90a')}" in out
    failed = [line for line in out.splitlines() if line.startswith("FAIL sm_100a: ")]
    assert len(failed) == 1 and "lists no kernel" in failed[0] and "build_kernels.py --arch sm_100a" in failed[0]
    assert out.rstrip().endswith("verify --files-only: FAILED")


def test_verify_files_only_checks_the_named_arch_which_must_exist(cache, no_driver, capsys):
    """--arch A checks A only and requires its manifest; without --arch an arch with no manifest (nor cubins) is not
    checked."""
    import shutil

    from runtime import __main__ as cli

    shutil.rmtree(first_cubin(cache, "sm_100a").parent)
    manifest_path(cache, "sm_100a").unlink()
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "ok sm_90a" in out and "sm_100a" not in out
    assert cli.main(["verify", "--files-only", "--arch", "sm_100a", "--root", str(cache)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL sm_100a: ") and "ok sm_90a" not in out


def test_verify_files_only_says_a_manifest_of_an_unknown_arch_was_not_checked(cache, no_driver, capsys):
    """A manifest of an arch this runtime does not know (a newer build's) was passed over in silence, as if the
    cache had been checked whole. It is named as skipped, and does not fail the cache's known arches."""
    from runtime import __main__ as cli

    unknown = manifest_path(cache, "sm_120a")
    unknown.write_text(manifest_path(cache, "sm_100a").read_text())
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"skip sm_120a: {unknown} names an arch this runtime does not know (sm_90a, sm_100a), so no "
                      f"load reads it and it was not checked; serve that arch with a runtime that knows it")
    assert [line.split(":")[0] for line in out[1:3]] == ["ok sm_90a", "ok sm_100a"]
    manifest_path(cache, "sm_90a").unlink()
    manifest_path(cache, "sm_100a").unlink()
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("skip sm_120a: ") and out[1].startswith("FAIL: ") and "holds no manifest of" in out[1]
    assert cli.main(["verify", "--files-only", "--arch", "sm_90a", "--root", str(cache)]) == 1
    assert "skip" not in capsys.readouterr().out  # --arch names what to check


def test_verify_files_only_names_files_no_entry_names(cache, no_driver, capsys):
    """A stray file in an arch's cubin folder (a dropped variant's cubin, a killed build's staged copy) passed
    unsaid, though an install ships it. It is named in a note; the arch still passes, as no load reads it."""
    from runtime import __main__ as cli

    folder = first_cubin(cache, "sm_90a").parent
    (folder / "dropped_variant.cubin").write_bytes(b"old")
    (folder / ".probe_cluster2.cubin.tmp123").write_bytes(b"")
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index(next(line for line in out if line.startswith("ok sm_90a")))
    assert out[at + 1] == (f"note sm_90a: {cache} holds 2 file(s) no manifest entry names (cubins/sm_90a/.probe_"
                           f"cluster2.cubin.tmp123, cubins/sm_90a/dropped_variant.cubin); no load reads them, a build "
                           f"of the arch removes them")
    assert not any(line.startswith("note sm_100a") for line in out)


def test_verify_files_only_names_a_looping_link_and_a_staged_manifest_as_unnamed_files(cache, no_driver, capsys):
    """The note resolved each file of the cubin folder: a stray link to itself (a loop) raised pathlib's
    RuntimeError after the arch's ok line, a traceback instead of the verdict. And a killed build's staged copy of the
    manifest, which --check fails and a build removes as it does the folder's strays, went unsaid. The note now takes
    the build's own list (runtime.manifest.unnamed_files), compared by name."""
    import os

    from runtime import __main__ as cli

    folder = first_cubin(cache, "sm_90a").parent
    os.symlink("loop.cubin", folder / "loop.cubin")
    staged = manifest_path(cache, "sm_90a").parent / ".sm_90a.json.abc123"
    staged.write_text("{}")
    assert cli.main(["verify", "--files-only", "--arch", "sm_90a", "--root", str(cache)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (f"note sm_90a: {cache} holds 2 file(s) no manifest entry names (cubins/sm_90a/loop.cubin, "
                      f"manifests/.sm_90a.json.abc123); no load reads them, a build of the arch removes them")
    assert out[-1].startswith("verify --files-only: all checks passed")


@pytest.mark.parametrize("stand_in", ["dangling link", "folder", "fifo"])
def test_verify_files_only_fails_a_manifest_that_is_not_a_file(cache, no_driver, capsys, stand_in):
    """The arches were picked by is_file(): a dangling link, a folder or a FIFO at sm_100a's manifest path dropped the
    arch from the check, and verify said "all checks passed" of a cache whose load on that arch is refused. Anything
    standing at the path is now checked (and fails); only an absent manifest means the cache has no such arch."""
    import os

    from runtime import __main__ as cli

    path = manifest_path(cache, "sm_100a")
    path.unlink()
    {"dangling link": lambda: path.symlink_to(path.parent / "gone.json"), "folder": path.mkdir,
     "fifo": lambda: os.mkfifo(path)}[stand_in]()
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 1
    out = capsys.readouterr().out
    assert "ok sm_90a" in out and any(line.startswith("FAIL sm_100a: ") for line in out.splitlines())
    assert out.rstrip().endswith("verify --files-only: FAILED")


@pytest.mark.parametrize("left", ["cubins", "a staged manifest"])
def test_verify_files_only_fails_an_arch_whose_manifest_was_lost(cache, no_driver, capsys, left):
    """A cache whose sm_100a manifest was deleted, its cubin folder (or a killed build's staged copy of the manifest)
    left, passed as "all checks passed" without a word of sm_100a: a cache that lost a whole manifest, whose every
    call on an sm_100a GPU takes the torch fallback. That arch now fails, naming what is left and the rebuild."""
    import shutil

    from runtime import __main__ as cli

    manifest = manifest_path(cache, "sm_100a")
    if left == "a staged manifest":
        shutil.rmtree(first_cubin(cache, "sm_100a").parent)
        manifest.rename(manifest.parent / ".sm_100a.json.abc123")
    else:
        manifest.unlink()
    assert cli.main(["verify", "--files-only", "--root", str(cache)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok sm_90a: ")
    failed = [line for line in out if line.startswith("FAIL sm_100a: ")]
    what = "manifests/.sm_100a.json.abc123" if left == "a staged manifest" else "cubins/sm_100a/"
    assert len(failed) == 1 and f"holds {1 if left != 'cubins' else 2} file(s) of sm_100a ({what}" in failed[0]
    assert failed[0].endswith("but no manifest of it: no load reads them, and an sm_100a GPU would take the torch "
                              "fallback on every call. Fix: python build_kernels.py --arch sm_100a --out "
                              f"{cache}")
    assert out[-1] == "verify --files-only: FAILED"
    assert cli.main(["verify", "--files-only", "--arch", "sm_90a", "--root", str(cache)]) == 0  # sm_90a alone


@pytest.mark.parametrize("stand_in", ["root", "manifests"])
def test_verify_files_only_refuses_a_file_in_the_roots_place_with_a_fix_that_works(tmp_path, no_driver, capsys,
                                                                                    stand_in):
    """A root that is a file, or whose manifests/ is a file, was told to rebuild with --out <that root>, which
    build_kernels.py refuses (--out names a file; manifests is not a directory); with --arch it got the load's
    PathError. Both now say what the load says, for each arch."""
    from runtime import __main__ as cli

    root = tmp_path / "cache"
    if stand_in == "root":
        root.write_text("x")
    else:
        root.mkdir()
        (root / "manifests").write_text("x")
    for argv in ([], ["--arch", "sm_90a"]):
        assert cli.main(["verify", "--files-only", "--root", str(root), *argv]) == 1
        out = capsys.readouterr().out.splitlines()
        failed = [line for line in out if line.startswith("FAIL")]
        assert len(failed) == (len(argv) and 1 or 2), out
        assert all("a file stands where the cache root's folder or its manifests/ folder should be" in line
                   and "build_kernels.py" not in line for line in failed), failed


def test_verify_files_only_shows_a_file_name_that_is_no_utf8(cache):
    """A stray file whose name is no UTF-8 (Python keeps its bytes as surrogates) in a note or skip line raised
    UnicodeEncodeError under a strict UTF-8 stdout (a UTF-8 locale other than C's), a traceback before the other
    arch was checked. The name is shown escaped, and the check goes on."""
    import subprocess
    import sys

    folder = first_cubin(cache, "sm_90a").parent
    open(os.fsencode(str(folder / "stray\udcff.cubin")), "wb").close()
    open(os.fsencode(str(manifest_path(cache, "sm_\udcff"))), "wb").close()
    env = {k: v for k, v in os.environ.items() if k != "SPARSE_DECODE_AOT_CACHE"}
    env.update(PYTHONIOENCODING="utf-8", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "runtime", "verify", "--files-only", "--root", str(cache)],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                          capture_output=True, text=True, errors="replace", timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("skip sm_\\udcff: ") for line in lines), lines
    assert any(line.startswith("note sm_90a: ") and "cubins/sm_90a/stray\\udcff.cubin" in line for line in lines)
    assert lines[-1].startswith("verify --files-only: all checks passed")


def test_verify_files_only_fails_a_root_without_manifests(tmp_path, no_driver, capsys):
    from runtime import __main__ as cli

    assert cli.main(["verify", "--files-only", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out == (f"FAIL: {tmp_path.resolve()} holds no manifest of sm_90a, sm_100a. Fix: python build_kernels.py "
                   f"--out {tmp_path.resolve()}\n")


def test_verify_without_a_driver_names_files_only(cache, no_driver, monkeypatch, capsys):
    """verify's refusal where no driver is says what can still be checked on this machine."""
    from runtime import __main__ as cli

    monkeypatch.setattr(loader, "_caches", {})
    assert cli.verify(cache) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL: no CUDA driver on this machine (test).")
    assert "`python -m runtime verify --files-only` checks the cache's files without a GPU" in out


def test_verify_arch_goes_with_files_only(capsys):
    from runtime import __main__ as cli

    with pytest.raises(SystemExit) as refused:
        cli.main(["verify", "--arch", "sm_90a"])
    assert refused.value.code == 2 and "--arch goes with --files-only" in capsys.readouterr().err


def test_a_sticky_launch_error_names_an_earlier_fault_not_the_kernel(cache, stand_in):
    """cuLaunchKernelEx is asynchronous: CUDA_ERROR_ILLEGAL_ADDRESS from it is an earlier kernel's fault (the load path
    says so; the launch path named the kernel launched as if it had faulted)."""
    stand_in()
    kernel = loader.load(cache).kernel("probe_cluster2")
    kernel._launch = lambda *a: (real.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS.*an earlier kernel's fault, not probe_cluster2's"):
        kernel.launch(2, 0, 0, stream=5)
    kernel._launch = lambda *a: (real.CUresult.CUDA_ERROR_INVALID_VALUE,)
    with pytest.raises(RuntimeError, match=r"CUDA_ERROR_INVALID_VALUE \(stand-in driver error\)$"):
        kernel.launch(2, 0, 0, stream=5)
