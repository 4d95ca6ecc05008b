"""Running the ``probe`` kernels: the proof that a cache works on this GPU."""

from __future__ import annotations

CLUSTERS_PER_LAUNCH = 4


def expected_probe_output(cluster: int, clusters: int, seed: int) -> list[int]:
    """What the probe writes: each CTA holds the word its predecessor in the cluster sent."""
    out = []
    for block in range(cluster * clusters):
        rank = block % cluster
        pred = (rank - 1) % cluster
        pred_block = block - rank + pred
        out.append(1000 * (pred + 1) + pred_block + seed)
    return out


def run_probe(cache, seed: int = 7) -> dict:
    """Launch every probe variant twice back to back (the second waits on the first through
    programmatic dependent launch) and compare with the expected words. Returns
    {kernel name: None on success or the mismatch described}."""
    import torch

    results = {}
    for name in cache.names("probe"):
        kernel = cache.kernel(name)
        cluster = kernel.entry.cluster[0]
        n = cluster * CLUSTERS_PER_LAUNCH
        first = torch.full((n,), -1, dtype=torch.int32, device="cuda")
        second = torch.full((n,), -1, dtype=torch.int32, device="cuda")
        kernel.launch(n, first.data_ptr(), seed)
        kernel.launch(n, second.data_ptr(), seed + 1)
        torch.cuda.synchronize()
        problems = []
        for label, out, s in (("first", first, seed), ("second", second, seed + 1)):
            want = expected_probe_output(cluster, CLUSTERS_PER_LAUNCH, s)
            got = out.tolist()
            if got != want:
                problems.append(f"{label} launch wrote {got}, expected {want}")
        results[name] = "; ".join(problems) or None
    return results
