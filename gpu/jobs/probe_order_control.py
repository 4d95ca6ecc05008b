"""The probe's PDL-order check against a negative control (H200): does run_probe's two-launch check tell an
ordered second launch from an unordered one?

Ordered: run_probe's launches (the second behind the first on one stream, programmatic dependent launch).
Unordered: the same two launches on two streams with nothing between them, both queued behind one GPU spin as
run_probe queues its pair, so the second's read of `out` races the first's write, which the kernel holds back
20 us. Each trial's words are classed as ordered (the second added to the first's words), unordered (it read the
zeros from before) or other. Writes one JSON object to the path given."""

import json
import sys

import torch

import runtime
from runtime.probe import CLUSTERS_PER_LAUNCH, expected_probe_output, queue_behind_spin, run_probe

TRIALS = 50


def classify(got, cluster, seed):
    first = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed)
    if got == expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed + 1, first):
        return "ordered"
    unordered = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed + 1)
    if any(g == u for g, u in zip(got, unordered)):
        return "unordered"
    return "other"


def two_streams(kernel, cluster, seed):
    n = cluster * CLUSTERS_PER_LAUNCH
    out = torch.zeros((n,), dtype=torch.int32, device="cuda")
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    queue_behind_spin()  # as run_probe does: both launches queued (behind one spin) before either runs
    a.wait_stream(torch.cuda.current_stream())
    b.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(a):
        kernel.launch(n, out.data_ptr(), seed)
    with torch.cuda.stream(b):
        kernel.launch(n, out.data_ptr(), seed + 1)
    torch.cuda.synchronize()
    return out.tolist()


def main(path):
    from benchmarks.common import gpu_info

    cache = runtime.load()
    report = {"info": gpu_info(), "trials": TRIALS}
    probes = [run_probe(cache, seed=11 + 2 * t) for t in range(TRIALS)]  # every variant, each call
    for name in cache.names("probe"):
        kernel = cache.kernel(name)
        cluster = kernel.entry.cluster[0]
        checks = [probe[name] for probe in probes]
        control = {}
        for t in range(TRIALS):
            kind = classify(two_streams(kernel, cluster, 11 + t), cluster, 11 + t)
            control[kind] = control.get(kind, 0) + 1
        report[name] = {"run_probe_passed": sum(c is None for c in checks),
                        "run_probe_problems": sorted({c for c in checks if c is not None})[:3],
                        "two_streams": control}
        print(name, report[name], flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
