"""The runtime on a GPU: load, launch (clusters of 2 and 8, DSMEM, PDL), graph capture, verify."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cache():
    import runtime

    return runtime.load()


def test_probe_clusters_exchange_through_dsmem(cache):
    from runtime.probe import run_probe

    results = run_probe(cache, seed=11)
    assert set(results) == {"probe_cluster2", "probe_cluster8"}
    assert all(problem is None for problem in results.values()), results


def test_probe_launch_config_has_cluster_and_pdl(cache):
    import cuda.bindings.driver as drv

    for name, cluster in (("probe_cluster2", 2), ("probe_cluster8", 8)):
        kernel = cache.kernel(name)
        ids = [a.id for a in kernel._config.attrs]
        assert drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION in ids
        assert drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION in ids
        assert kernel.entry.cluster == (cluster, 1, 1)
        assert kernel.max_active_clusters > 0


def test_cuda_graph_capture_and_replay(cache):
    import torch
    from runtime.probe import expected_probe_output

    kernel = cache.kernel("probe_cluster8")
    out = torch.full((16,), -1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        kernel.launch(16, out.data_ptr(), 5)  # warm on the side stream, as torch asks
    torch.cuda.synchronize()
    out.fill_(-1)
    with torch.cuda.graph(graph):
        kernel.launch(16, out.data_ptr(), 5)
    torch.cuda.synchronize()
    assert out.tolist() == [-1] * 16, "capture must not run the kernel"
    graph.replay()
    torch.cuda.synchronize()
    once = expected_probe_output(8, 2, 5, [-1] * 16)
    assert out.tolist() == once
    graph.replay()  # each launch adds to the words the previous one left
    torch.cuda.synchronize()
    assert out.tolist() == expected_probe_output(8, 2, 5, once)


def test_launch_rejects_bad_grid_and_arity(cache):
    kernel = cache.kernel("probe_cluster8")
    with pytest.raises(ValueError, match="multiple of 8"):
        kernel.launch(12, 0, 1)
    with pytest.raises(TypeError, match="takes 2 arguments"):
        kernel.launch(8, 0)


def test_unknown_kernel_is_a_typed_error(cache):
    from runtime.errors import CacheError, UnknownKernelError

    with pytest.raises(UnknownKernelError) as e:
        cache.kernel("no_such_kernel")
    assert isinstance(e.value, CacheError)


def test_sm100_manifest_refused_on_hopper():
    import torch
    from runtime.errors import DeviceArchError
    from runtime.loader import load_manifest
    from runtime.manifest import default_root, read_manifest

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("checks the refusal on a Hopper GPU")
    with pytest.raises(DeviceArchError, match="sm_100a"):
        load_manifest(read_manifest(default_root(), "sm_100a"), 0)


def test_python_m_runtime_verify_passes():
    proc = subprocess.run([sys.executable, "-m", "runtime", "verify"], capture_output=True, text=True, timeout=300)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout
    from runtime.__main__ import PROBE_OK

    for name in ("probe_cluster2", "probe_cluster8"):
        assert f"  probe {name}: {PROBE_OK}\n" in proc.stdout, proc.stdout


@pytest.mark.parametrize("edit, error, match", [
    ("symbol", "SymbolError", "cubin has no kernel symbol"),
    ("shift_second_param", "ParamLayoutError", "contradict cuFuncGetParamInfo"),
    ("add_param", "ParamLayoutError", "lists 3 parameters, the cubin's ELF has 2"),
    ("drop_last_param", "ParamLayoutError", "the cubin's ELF has 2"),
])
def test_crafted_cache_refused_by_the_driver_checks(tmp_path, monkeypatch, edit, error, match):
    """load() refuses a manifest the cubin contradicts: the symbol, the parameter count (from the ELF's attribute
    list, read before the driver load) and the layout (the driver's cuFuncGetParamInfo). The contract is made to
    agree with the crafted manifest: the cubin is what disagrees."""
    import crafted_cache
    import torch

    import runtime
    from runtime import errors
    from runtime.loader import arch_for_capability

    arch = arch_for_capability(torch.cuda.get_device_capability())
    crafted_cache.copy_probe_cache(tmp_path)
    if edit == "symbol":
        crafted_cache.edit_manifest(tmp_path, arch, lambda d: d["kernels"][0].update(symbol="kernel_not_there"))
    else:
        crafted_cache.edit_manifest(tmp_path, arch, getattr(crafted_cache, edit))
    crafted_cache.contract_follows_the_manifest(monkeypatch, tmp_path, arch)
    with pytest.raises(getattr(errors, error), match=match) as e:
        runtime.load(tmp_path)
    assert e.value.kernel == "probe_cluster2"


def test_load_profile_on_request():
    """SPARSE_DECODE_AOT_LOAD_PROFILE=1: load()'s phases, in a fresh process."""
    code = "import json, runtime; print(json.dumps(runtime.load().load_profile))"
    env = {**os.environ, "SPARSE_DECODE_AOT_LOAD_PROFILE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    profile = json.loads(proc.stdout.strip().splitlines()[-1])
    print(profile)
    assert profile["phases_ms"]["cuLibraryLoadData"] > 0 and profile["kernels"] > 0
    assert "runtime.load profile:" in proc.stderr


FIRST_CALL_IN_CAPTURE = """
import warnings
import torch
import runtime
from runtime import topk
from runtime.topk import decode_topk

launched, launch_on = [], topk.launch_on
topk.launch_on = lambda device, kernel, *args: launched.append(kernel.name) or launch_on(device, kernel, *args)


def no_fallback(*args, **kwargs):
    raise AssertionError("the exact fallback ran")


topk.decode_topk_reference = no_fallback
logits = torch.randn(2, 8192, device="cuda")
ends = torch.full((2,), 8192, dtype=torch.int32, device="cuda")
out = torch.empty(2, 512, dtype=torch.int32, device="cuda")
graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)  # no fallback warning: nothing may be remembered as a refusal
    try:
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            decode_topk(logits, ends, out)
        print("captured")
    except runtime.CacheLoadInterrupted as e:
        print("refused:", e)
    print("launched in capture:", launched)
    decode_topk(logits, ends, out)  # after the capture the first call loads and runs the kernel
    torch.cuda.synchronize()
    ref = torch.topk(logits, 512, dim=1).indices.sort(dim=1).values.int()
    print("kernel after capture:", torch.equal(out.sort(dim=1).values, ref), len(launched))
"""


def test_first_call_during_capture_is_refused_then_loads():
    """A fresh process whose first decode_topk call comes inside CUDA graph capture gets CacheLoadInterrupted (the
    load cannot be captured) with nothing remembered: its next call, outside capture, loads and runs the kernel (one
    launch recorded, the exact fallback made to raise: the same sets from torch would not tell them apart)."""
    proc = subprocess.run([sys.executable, "-c", FIRST_CALL_IN_CAPTURE], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused:" in proc.stdout and "runtime.load(device=0)" in proc.stdout, proc.stdout
    assert "launched in capture: []" in proc.stdout, proc.stdout
    assert "kernel after capture: True 1" in proc.stdout, proc.stdout


def test_a_thread_whose_first_cuda_work_is_an_op_launches_it(cache, monkeypatch):
    """A worker thread has no CUDA context current until its first CUDA call, and decode_topk given every buffer makes
    none before its launch; a CUkernel launched on the default stream runs in the current context, so the driver
    would refuse it (CUDA_ERROR_INVALID_CONTEXT). The launch binds the device's primary context and runs: the thread's
    rows equal the reference's, by the AOT kernel."""
    import threading

    import torch

    from runtime import topk
    from runtime.reference import decode_topk_reference
    from runtime.topk import decode_topk, decode_topk_plan

    rows, width, k = 4, 8192, 512
    logits = torch.randn(rows, width, device="cuda")
    row_ends = torch.tensor([width, 5000, 0, 700], dtype=torch.int32, device="cuda")
    out = torch.full((rows, k), -2, dtype=torch.int32, device="cuda")
    assert decode_topk_plan(logits, rows, k, False) is not None, "the kernel takes the call"
    decode_topk(logits, row_ends, out)  # loaded on this thread; the worker's call finds it loaded
    torch.cuda.synchronize()
    out.fill_(-2)
    torch.cuda.synchronize()
    raised, launched, launch_on = [], [], topk.launch_on
    monkeypatch.setattr(topk, "launch_on", lambda device, kernel, *args: launched.append(kernel.name)
                        or launch_on(device, kernel, *args))
    monkeypatch.setattr(topk, "decode_topk_reference", lambda *a, **kw: pytest.fail("the fallback ran"))

    def worker():
        try:
            decode_topk(logits, row_ends, out)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            raised.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not raised, raised
    assert len(launched) == 1, launched
    torch.cuda.synchronize()
    ref = decode_topk_reference(logits, row_ends, k)
    assert torch.equal(torch.sort(out, dim=1).values, torch.sort(ref, dim=1).values)
