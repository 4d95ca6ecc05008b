"""One JSON record from gpu/jobs/tree_ab.sh's archive: the decode_topk grid of both trees cell by cell (the candidate's
time over the base's, the lesser of the two rounds each), their target checks, the FP32 64 x 1M cell probe and the
indexer benchmark's shares. The device copy's git metadata can be stale, so the commits are given here and each side's
source_sha256 is read from its records.

    python3 gpu/tools/tree_ab_summary.py UNPACKED_DIR OUT.json --base-commit SHA --cand-commit 'SHA + PATCH' \
        --raw ARCHIVE_NAME [--bench TEXT] [--base-note TEXT]

(benchmarks/results/twin_list_headroom_ab_s58_h100.json was made so from twin_list_headroom_ab_s58_h100.tgz.)
"""

import argparse
import json
from pathlib import Path

ROUNDS = (1, 2)


def _load(src: Path, name: str):
    return json.loads((src / f"{name}.json").read_text())


def _cell_key(c: dict) -> str:
    return f"{c['dtype']} rows={c['rows']} len={c['length']} k={c['k']}" + (" block" if c["block_mode"] else "")


def grid(src: Path, side: str) -> dict:
    cells = {}
    for r in ROUNDS:
        for c in _load(src, f"topk_{side}_{r}")["cells"]:
            e = cells.setdefault(_cell_key(c), {"kernel": c["kernel"]["name"], "op_us": [], "op_in_stream_order_us": []})
            e["op_us"].append(round(c["op"]["median_us"], 2))
            e["op_in_stream_order_us"].append(round(c["op_in_stream_order"]["median_us"], 2))
    return cells


def ratios(base: dict, cand: dict, field: str) -> dict:
    r = {k: round(min(cand[k][field]) / min(base[k][field]), 3) for k in base}
    return dict(sorted(r.items(), key=lambda kv: kv[1]))


def targets(src: Path, side: str) -> list:
    out = []
    for r in ROUNDS:
        t = _load(src, f"topk_{side}_{r}")["targets"]
        out.append({"round": r, "met": sum(x["met"] for x in t), "of": len(t), "missed": [x for x in t if not x["met"]]})
    return out


def probe(src: Path, side: str) -> list:
    return [{"round": r, "seed": c["seed"], "k": c["k"], "op_us": round(c["op_us"], 2),
             "op_in_stream_order_us": round(c["op_in_stream_order_us"], 2),
             "by_kernel_us": {k: round(v, 2) for k, v in c["by_kernel_us"].items()}}
            for r in ROUNDS for c in _load(src, f"probe_{side}_{r}")["cells"]]


def shares(src: Path, side: str) -> list:
    return [{"rows": r["rows"], "context": r["context"], "select_us": round(r["select"]["median_us"], 2),
             "step_us": round(r["step"]["median_us"], 2), "share": round(r["select_share_of_step"], 3),
             "marginal_share": round(r["select_marginal_share_of_step"], 3)}
            for r in _load(src, f"indexer_{side}")["results"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="tree_ab.tgz unpacked")
    ap.add_argument("out", type=Path)
    ap.add_argument("--base-commit", required=True)
    ap.add_argument("--cand-commit", required=True)
    ap.add_argument("--raw", required=True, help="the archive's name under benchmarks/results")
    ap.add_argument("--bench", default="tree A/B (gpu/jobs/tree_ab.sh, two alternating rounds)", help="what was timed")
    ap.add_argument("--base-note", default=None)
    a = ap.parse_args()
    info_b, info_c = _load(a.src, "topk_base_1")["info"], _load(a.src, "topk_cand_1")["info"]
    base, cand = grid(a.src, "base"), grid(a.src, "cand")
    base_side = {"commit": a.base_commit, "source_sha256": info_b["source_sha256"],
                 "manifest_sha256": info_b["manifest_sha256"]}
    if a.base_note:
        base_side["note"] = a.base_note
    summary = {
        "bench": a.bench,
        "gpu": info_b["gpu"], "driver": info_b["driver"],
        "base": base_side,
        "candidate": {"commit": a.cand_commit, "source_sha256": info_c["source_sha256"],
                      "manifest_sha256": info_c["manifest_sha256"]},
        "raw": a.raw,
        "grid_ratio_cand_over_base_min_of_rounds": ratios(base, cand, "op_us"),
        "grid_ratio_in_stream_order": ratios(base, cand, "op_in_stream_order_us"),
        "grid_base": base, "grid_candidate": cand,
        "targets_base": targets(a.src, "base"), "targets_candidate": targets(a.src, "cand"),
        "probe_64x1M_f32_base": probe(a.src, "base"), "probe_64x1M_f32_candidate": probe(a.src, "cand"),
        "indexer_base": shares(a.src, "base"), "indexer_candidate": shares(a.src, "cand"),
    }
    a.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
