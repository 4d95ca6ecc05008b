"""Shared measuring tools (DESIGN.md, "Measuring speed").

GPU time comes from CUDA-graph replay: one graph runs the op over several input
sets in turn (rotated so the working set exceeds the L2), replayed at least 20
times; the per-call time is the median replay time over the calls in the graph.
The floor of a kernel is an empty kernel launched with the same grid and cluster
shape plus the bytes it must move over the measured copy bandwidth.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

import torch

L2_ROTATE_FACTOR = 3  # the rotated sets together span this many L2s


def head_commit(root: Path = Path(__file__).parent) -> str:
    """git's HEAD at ``root`` ("" without git; the environment's GIT_COMMIT where a copy carries no git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    except OSError:
        commit = ""
    return commit or os.environ.get("GIT_COMMIT", "")


def tree_info() -> dict:
    """The code a result was measured or computed with (the host's share of gpu_info, for a CPU-only record)."""
    here = Path(__file__).parent
    return {
        "commit": head_commit(here),
        "files_differ_from_commit": files_differ_from_head(here.parent),
        "host": platform.node(),
        # A lent GPU machine's copy of the checkout may carry older git metadata than its files:
        # the manifests' digests name the cubins that were measured whatever HEAD says, and the
        # source digest names the host code (`python -m benchmarks.common --source-digest REV`
        # gives a commit's digest to compare).
        "manifest_sha256": manifest_digests(),
        "source_sha256": source_digest(),
    }


def gpu_info() -> dict:
    """The GPU, driver and commit a result was measured on: the current device, where the benchmarks' tensors go
    (``torch.device("cuda")``), not device 0."""
    index = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(index)
    try:
        # one line a GPU, all the host's one driver (nvidia-smi's numbering ignores CUDA_VISIBLE_DEVICES)
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().partition("\n")[0]
    except (OSError, subprocess.SubprocessError):
        driver = ""
    return {
        "gpu": p.name, "device_index": index, "sms": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda,
        **tree_info(),
        "packages": package_versions(),
        "switches": run_switches(),
    }


# The installed packages that a measurement's peers and scorer come from (the Triton peer, DeepGEMM's logits).
MEASURED_PACKAGES = ("triton", "cuda-bindings", "sgl-deep-gemm", "deep-gemm", "tokenspeed-deepgemm", "apache-tvm-ffi")


def package_versions(names=MEASURED_PACKAGES) -> dict:
    """{distribution: version} of those of ``names`` installed (metadata only: nothing is imported)."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


# Environment variables that change what a run measures: the runtime's (the cache root, the metadata value check,
# a measurement build's load), DeepGEMM's (its JIT cache, SM count) and CUDA's launch settings.
SWITCH_PREFIXES = ("SPARSE_DECODE_AOT_", "DG_", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "CUDA_VISIBLE_DEVICES")


def run_switches(environ=None) -> dict:
    """{name: value} of the environment variables of SWITCH_PREFIXES set for this run."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(SWITCH_PREFIXES)}


def files_differ_from_head(root: Path) -> bool | None:
    """Whether the tracked files under ``root`` differ from git's HEAD (None: no git). A lent GPU machine's copy
    of the checkout can carry git metadata older than its files: its ``commit`` then does not name the code."""
    try:
        rc = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=root, capture_output=True,
                            timeout=60).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: False, 1: True}.get(rc)


SOURCE_FOLDERS = ("runtime", "benchmarks")  # the host code a measurement ran


def source_digest(read=None) -> str:
    """First 16 hex digits of sha256 over the host code's .py files (path and bytes, sorted by
    path). ``read() -> [(path, bytes), ...]`` gives the files; None reads every .py file of the
    working tree's SOURCE_FOLDERS, untracked ones included (a stray script there makes the digest
    match no commit: the GPU machine's copy carries untracked files that git does not ignore)."""
    root = Path(__file__).resolve().parent.parent
    if read is None:
        paths = sorted(str(p.relative_to(root)) for f in SOURCE_FOLDERS for p in (root / f).rglob("*.py"))
        files = [(p, (root / p).read_bytes()) for p in paths]
    else:
        files = read()
    h = hashlib.sha256()
    for path, data in files:
        h.update(path.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


def source_digest_of_commit(rev: str) -> str:
    """``source_digest`` of a commit's tree (git show), to match a result's ``source_sha256``."""
    root = Path(__file__).resolve().parent.parent

    def git(*args) -> bytes:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True).stdout

    def read():
        names = git("ls-tree", "-r", "--name-only", rev, "--", *SOURCE_FOLDERS).decode().split("\n")
        paths = sorted(n for n in names if n.endswith(".py"))
        return [(p, git("show", f"{rev}:{p}")) for p in paths]

    return source_digest(read)


def manifest_digests() -> dict:
    """{arch: first 16 hex digits of sha256} of the cache root's manifests (the cubins' sha256 are inside)."""
    from runtime.manifest import default_root

    folder = default_root() / "manifests"
    return {m.stem: hashlib.sha256(m.read_bytes()).hexdigest()[:16] for m in sorted(folder.glob("*.json"))}


def l2_bytes() -> int:
    """The current device's L2 (gpu_info's and the tensors' device; device 0's sized the rotation for another GPU)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 60 << 20) or (60 << 20)


def rotation_count(bytes_per_set: int, most: int = 64) -> int:
    """How many input sets to rotate so that together they exceed the L2 several times."""
    need = -(-L2_ROTATE_FACTOR * l2_bytes() // max(1, bytes_per_set))
    return int(max(2, min(most, need)))


def launches_for(sets: int, least: int = 20) -> int:
    """Launches of a timed graph that cycles through ``sets`` input sets: at least ``least``, and a whole number of
    rounds, so that each replay ends on the last set and the next begins on the first, the set read longest ago (20
    launches over 18 sets ended on sets 0 and 1, which the next replay read again from the L2)."""
    return sets * -(-least // sets)


LEAD_CYCLES = 2_000_000  # about 1 ms of GPU clock ahead of each timed replay (time_graph)


def capture_graph(run, configure=None) -> torch.cuda.CUDAGraph:
    """``run()`` captured in a CUDA graph, ready to replay. ``configure``, where given, is called with the captured
    ``torch.cuda.CUDAGraph`` before it is instantiated (e.g. to set its kernel nodes' attributes)."""
    # keep_graph (torch >= 2.9) only where a hook needs the graph before it is instantiated
    graph = torch.cuda.CUDAGraph() if configure is None else torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        run()
    if configure is not None:
        configure(graph)
        graph.instantiate()
    return graph


def time_graph(calls, *, launches: int | None = None, repeats: int = 20, warmup: int = 3, configure=None) -> dict:
    """Median GPU microseconds per call of ``calls`` (zero-argument callables, one per input set).

    One CUDA graph runs ``launches`` calls (default ``launches_for``) cycling through the sets; it is replayed
    ``repeats`` times, each timed with events. ``configure``: as ``capture_graph``'s.
    """
    calls = list(calls)
    launches = launches or launches_for(len(calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    def run_all() -> None:  # each call's result dropped at once: an output it returns reuses one block in the pool
        for i in range(launches):
            calls[i % len(calls)]()

    graph = capture_graph(run_all, configure)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # The GPU spins while the host submits the start event and the graph: otherwise the idle gap between
        # the two (host time, several us) lands inside the timed window, divided over the launches.
        torch.cuda._sleep(LEAD_CYCLES)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "repeats": repeats, "launches_per_graph": launches, "input_sets": len(calls)}


def time_eager(calls, *, repeats: int = 20, warmup: int = 3) -> dict:
    """Like time_graph, for ops that cannot be captured (host syncs): events around each round."""
    calls = list(calls)
    for _ in range(warmup):
        for c in calls:
            c()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for c in calls:
            c()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return {"median_us": statistics.median(times), "min_us": min(times), "max_us": max(times),
            "repeats": repeats, "input_sets": len(calls), "eager": True}


_bandwidth = None


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    global _bandwidth
    if _bandwidth is None:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        t = time_eager([lambda: dst.copy_(src)], repeats=20)
        _bandwidth = 2 * nbytes / (t["median_us"] * 1e-6) / 1e9
    return _bandwidth


def empty_kernel_us(grid: int, cluster: int = 1) -> float:
    """GPU time of an empty kernel with this grid (CTAs) and cluster size, from the cache."""
    import runtime
    from runtime.contract.empty import name_for

    kernel = runtime.load().kernel(name_for(cluster))
    return time_graph([lambda: kernel.launch(grid, 0)], launches=100)["median_us"]


def floor(grid: int, cluster: int, nbytes: int) -> dict:
    """The floor of a kernel: empty launch of its shape + bytes over the copy bandwidth."""
    bw = copy_bandwidth_gbs()
    empty = empty_kernel_us(grid, cluster)
    bytes_us = nbytes / (bw * 1e9) * 1e6
    return {"empty_kernel_us": empty, "bytes": nbytes, "bytes_us": bytes_us, "copy_gbs": bw,
            "floor_us": empty + bytes_us}


def write_json(path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Which host code a result's source_sha256 names.")
    parser.add_argument("--source-digest", nargs="?", const="", metavar="REV",
                        help="print the digest of commit REV (default: the working tree)")
    args = parser.parse_args()
    if args.source_digest is not None:
        print(source_digest_of_commit(args.source_digest) if args.source_digest else source_digest())
