"""decode_topk under compute-sanitizer: a few small launches of every path, checked against the reference.

    compute-sanitizer --tool {memcheck,racecheck,synccheck} python3 gpu/jobs/topk_sanitize.py [--quick] [--shard=I/N]
        [--crowded=with|skip|only]

Covers cluster sizes 1, 2 and 16, the 2-CTA one-CTA-an-SM twin ("twin2": step 1's table on a pair) and the
short-row kernel, FP32/BF16, token/block mode, both step-1 loops (a
110K-column slice of one CTA takes the warp loop; the twins take it past 128K, on rows that crowd one warp's list
segment), the gathered and the cluster-wide
finish, the list path, the global-memory fallback path (all-equal rows overflow the
list), ordered ties, short rows and a partial last group. k is 512 in --quick; the full mode takes k = 512, 1024
and 2048 in turn over its cases (k sets the list's and the output's sizes; until the fifty-second session every
recorded run had k = 512 only). Exits non-zero on a wrong result.

The crowded-warp cases (--crowded: with the others, the default; skip; only) were slow under the tools on the
thirty-third session's twins, which gave up their lists on such rows and took the slow path; the fifty-eighth
session's twins (a list of 16384 entries) keep it on 119 of 120 such CTAs in step 1's emulation
(step1_list_emulation_s56.txt), so the cases now reach the list's headroom, while the all-equal rows still overflow
it. One row a launch there; on the H200 (fifty-seventh session, the earlier twins), with three rows a launch, memcheck
and synccheck each finished two of them in the 240 s they had, and racecheck not the first, so topk_sanitize_full.sh
leaves them out of racecheck's shards and gpu/jobs/topk_racecheck_crowded.sh runs them alone (not yet run on the new
twins).
"""

import sys

import torch

from benchmarks.step1_list_emulation import CROWDED_CTA_COLUMNS, crowded_warp_rows


def main() -> int:
    quick = "--quick" in sys.argv
    crowded = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--crowded=")), "with")
    assert crowded in ("with", "skip", "only"), crowded
    import runtime
    from runtime.contract import decode_topk as contract
    from runtime.reference import decode_topk_reference

    cache = runtime.load()
    bad = 0
    cases = 0
    # First, the twins past their table's tiles (step 1's warp loop), on crowded-warp slices (one warp's list segment
    # overflows: benchmarks/step1_list_emulation.py) and, on 2 CTAs, all-equal rows (every segment fills to its last
    # slot): the newest cases, and the slowest, so that a shard cut short by its time has run them (each case prints
    # a line as it ends; topk_sanitize_full.sh counts them).
    crowded_combos = [(d, t, False, twin, int(twin[-1]) * CROWDED_CTA_COLUMNS)
                      for d, t in (("f32", torch.float32), ("bf16", torch.bfloat16)) for twin in ("twin2", "twin4")]
    combos = [(d, t, b, c, w) for d, t in (("f32", torch.float32), ("bf16", torch.bfloat16))
               for b in (False, True) for c in (1, 2, 4, 8, 16) for w in (40003, 110003)]
    combos += [(d, t, False, twin, 110003) for d, t in (("f32", torch.float32), ("bf16", torch.bfloat16))
               for twin in ("twin2", "twin4")]
    # The short-row kernel ("row": one CTA a row) at its widest rows and a shorter one.
    combos += [(d, t, b, "row", w) for d, t in (("f32", torch.float32), ("bf16", torch.bfloat16))
               for b in (False, True) for w in (contract.ROW_MAX_WIDTH - 5, 5003)]
    combos = {"with": crowded_combos + combos, "skip": combos, "only": crowded_combos}[crowded]
    # quick: both dtypes and modes, a cluster (list path), a single CTA (global-memory path on "equal"), both step 1s
    if quick:
        combos = [("f32", torch.float32, False, 2, 40003), ("bf16", torch.bfloat16, True, 1, 40003),
                  ("f32", torch.float32, False, 1, 110003),
                  ("f32", torch.float32, False, "row", contract.ROW_MAX_WIDTH - 5),
                  ("bf16", torch.bfloat16, True, "row", 5003), ("bf16", torch.bfloat16, False, "twin2", 110003),
                  ("f32", torch.float32, False, "twin2", 110003),  # (FP32 twin: step 1's bulk copies)
                  # The one-CTA-an-SM 8- and 16-CTA kernels (non-portable cluster, st.async pushes into CTA 0's list):
                  # every recorded sanitizer run so far (all --quick) left them out.
                  ("f32", torch.float32, False, 16, 110003), ("bf16", torch.bfloat16, False, 8, 40003),
                  ("bf16", torch.bfloat16, True, 16, 40003)]
    # --shard I/N: the I-th of N interleaved parts of the cases, so that racecheck's full mode (slow) can run as
    # N processes side by side.
    shard = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--shard=")), "0/1")
    part, parts = (int(v) for v in shard.split("/"))
    for index, (dtype, tdtype, block_mode, cluster, width) in list(enumerate(combos))[part::parts]:
        if cluster == "row":
            kernel = cache.kernel(contract.row_name_for(dtype, block_mode))
            cluster = 1
        elif cluster in ("twin2", "twin4"):
            cluster = int(cluster[-1])
            kernel = cache.kernel(contract.name_for(dtype, block_mode, cluster, full_sm=True))
        else:
            kernel = cache.kernel(contract.name_for(dtype, block_mode, cluster))
        # Cycled within each shard (a shard takes every parts-th case: index % 3 alone would give a shard of 6 one k,
        # and two of them every case at k = 2048, the slowest under racecheck).
        k = 512 if quick else (512, 1024, 2048)[(index // parts) % 3]
        is_crowded = width == cluster * CROWDED_CTA_COLUMNS
        if is_crowded:
            # k 1024 and 2048 on each twin and each dtype (at k 512 no warp can hold more than its list share of
            # items at the k-th bin or above)
            k = (1024, 2048)[(index // 2 + index) % 2]
        # A padded row stride, rounded up to 8 elements: 16-byte aligned rows, as the op requires of a launch of
        # several rows (runtime.topk._layout_refusal). The crowded widths (2 x and 4 x 139264) + 5 were not, and
        # their launches failed with a misaligned address (H100, fifty-seventh session); the others were already.
        stride = -(-(width + 5) // 8) * 8
        kinds = ("randn", "equal") if quick else ("randn", "equal", "ties")
        if is_crowded:
            # All-equal rows there count every column with an atomic once the lists are given up: on 2 CTAs only,
            # to keep the tools inside verify_all.sh's time (the 4-CTA twin's would be ~5x the c1 one's).
            kinds = ("crowded_warp", "equal") if cluster == 2 else ("crowded_warp",)
        rows = 1 if is_crowded else 3  # (the crowded rows: once, as slow as they may be under a tool)
        for kind in kinds:
            x = torch.randn(rows, stride, device="cuda")
            if kind == "crowded_warp":
                x[:, :width] = crowded_warp_rows(rows, cluster, CROWDED_CTA_COLUMNS, k, seed=index).to("cuda")
            elif kind == "equal":
                x[:] = 1.5
            elif kind == "ties":
                x = torch.randint(0, 7, (rows, stride), device="cuda").float()
            x = x.to(tdtype)
            # Row ends: full, short of k, clipped past the width, and (ties) none or negative; a crowded launch's one
            # row takes the last.
            last = {"randn": width - 5, "crowded_warp": width - 5, "equal": width + 7, "ties": -3}[kind]
            ends = torch.tensor([width, 300 if kind != "ties" else 0, last][-rows:], dtype=torch.int32, device="cuda")
            out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
            kernel.launch(rows * cluster, x.data_ptr(), ends.data_ptr(), out.data_ptr(), width, stride,
                          out.stride(0), k)
            torch.cuda.synchronize()
            ref = decode_topk_reference(x[:, :width], ends, k, block_mode=block_mode)
            cases += 1
            if not torch.equal(torch.sort(out, 1).values, torch.sort(ref, 1).values):
                bad += 1
                print(f"MISMATCH {kernel.name} {kind} k={k}", flush=True)
            else:
                print(f"case ok: {kernel.name} {kind} width {width} k={k}", flush=True)
    print(f"{cases - bad}/{cases} cases match", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
