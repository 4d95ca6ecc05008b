"""Running the ``probe`` kernels: the proof that a cache works on this GPU."""

from __future__ import annotations

CLUSTERS_PER_LAUNCH = 4
# A GPU spin ahead of the two launches (clock cycles, ~100 us on an H200): both are queued before the first runs, so
# the second starts beside the first however long the host takes between them (gpu/jobs/probe_order_control.py).
QUEUE_SPIN_CYCLES = 200_000


def expected_probe_output(cluster: int, clusters: int, seed: int, previous: list[int] | None = None) -> list[int]:
    """What one probe launch leaves in ``out``: each CTA adds the word its predecessor in the cluster sent, and the
    seed, to the word ``out`` held before the launch (``previous``; zeros when None)."""
    previous = previous or [0] * (cluster * clusters)
    out = []
    for block in range(cluster * clusters):
        rank = block % cluster
        pred = (rank - 1) % cluster
        pred_block = block - rank + pred
        out.append(1000 * (pred + 1) + pred_block + seed + previous[block])
    return out


def queue_behind_spin() -> None:
    """Hold the current stream for QUEUE_SPIN_CYCLES on the GPU (torch's test spin; nothing where torch lacks it)."""
    import torch

    spin = getattr(torch.cuda, "_sleep", None)
    if spin is not None:
        spin(QUEUE_SPIN_CYCLES)


def run_probe(cache, seed: int = 7) -> dict:
    """Launch every probe variant twice back to back on one zeroed buffer and compare with the expected words.

    The second launch starts beside the first (which releases its dependents at once, programmatic dependent
    launch) and adds to the words the first writes late: it sees them only where its dependency wait held it until
    the first grid was done. Returns {kernel name: None on success or the mismatch described}."""
    import torch

    results = {}
    for name in cache.names("probe"):
        kernel = cache.kernel(name)
        cluster = kernel.entry.cluster[0]
        n = cluster * CLUSTERS_PER_LAUNCH
        out = torch.zeros((n,), dtype=torch.int32, device="cuda")
        queue_behind_spin()
        kernel.launch(n, out.data_ptr(), seed)
        kernel.launch(n, out.data_ptr(), seed + 1)
        torch.cuda.synchronize()
        first = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed)
        want = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed + 1, first)
        got = out.tolist()
        problem = None
        if got != want:
            # Which launch's words are missing: the first's (the second read before they landed) or a DSMEM word.
            unordered = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed + 1)
            early = [b for b in range(n) if got[b] == unordered[b]]
            problem = f"wrote {got}, expected {want}"
            if early:
                problem += (f"; CTAs {early} of the second launch read out before the first launch's writes: "
                            f"programmatic dependent launch did not order them")
        results[name] = problem
    return results
