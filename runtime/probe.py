"""Running the ``probe`` kernels: the proof that a cache works on this GPU."""

from __future__ import annotations

CLUSTERS_PER_LAUNCH = 4
# A GPU spin ahead of the two launches (clock cycles, ~100 us on an H200): both are queued before the first runs, so
# the second starts beside the first however long the host takes between them (gpu/jobs/probe_order_control.py).
QUEUE_SPIN_CYCLES = 200_000
# Pairs of launches a probe variant runs. Whether a pair overlaps is up to the GPU: in a negative control without the
# ordering (probe_order_control_s47b.json) 41-47 of 50 pairs showed the race, so one broken order goes unseen in a
# few pairs out of three only rarely.
PROBE_PAIRS = 3


def expected_probe_output(cluster: int, clusters: int, seed: int, previous: list[int] | None = None) -> list[int]:
    """What one probe launch leaves in ``out``: each CTA adds the word its predecessor in the cluster sent, and the
    seed, to the word ``out`` held before the launch (``previous``; zeros when None)."""
    previous = [0] * (cluster * clusters) if previous is None else previous
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
    """Launch every probe variant twice back to back on one zeroed buffer, PROBE_PAIRS times, and compare with the
    expected words; on the cache's device (``cache.device``), whichever device is current.

    The second launch may start beside the first (which releases its dependents at once, programmatic dependent
    launch) and adds to the words the first writes late: where the two overlap, it sees them only because its
    dependency wait held it until the first grid was done (where the GPU runs them one after the other, as under
    compute-sanitizer, stream order alone gives the same words). Returns {kernel name: None on success or the
    first mismatch described}."""
    import torch

    results = {}
    # The cache's device current throughout: its kernels launch on the current device's stream and refuse another
    # (a cache of runtime.load(device=i) while another GPU is current), and the buffer, the spin and the
    # synchronize below are the current device's.
    with torch.cuda.device(cache.device):
        for name in cache.names("probe"):
            kernel = cache.kernel(name)
            cluster = kernel.entry.cluster[0]
            n = cluster * CLUSTERS_PER_LAUNCH
            problem = None
            for pair in range(PROBE_PAIRS):
                s = seed + 2 * pair
                out = torch.zeros((n,), dtype=torch.int32, device="cuda")
                queue_behind_spin()
                kernel.launch(n, out.data_ptr(), s)
                kernel.launch(n, out.data_ptr(), s + 1)
                torch.cuda.synchronize()
                problem = _pair_problem(out.tolist(), cluster, s)
                if problem is not None:
                    break
            results[name] = problem
    return results


def _pair_problem(got: list[int], cluster: int, seed: int) -> str | None:
    """None where a pair of probe launches (seeds ``seed``, ``seed + 1``) left the chained words, else what differs."""
    first = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed)
    want = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed + 1, first)
    if got == want:
        return None
    # The race's two outcomes: the second launch read the zeros from before the first's writes (its words are
    # left), or it did and the first's writes landed after its own (the first's words are left).
    unordered = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, seed + 1)
    early = [b for b in range(len(got)) if got[b] in (unordered[b], first[b])]
    problem = f"wrote {got}, expected {want}"
    if early:
        problem += (f"; CTAs {early} of the second launch read out before the first launch's writes: programmatic "
                    f"dependent launch did not order them")
    return problem
