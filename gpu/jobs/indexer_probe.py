"""Does this DeepGEMM score on this GPU? Import, schedule, logits against the torch reference.

``indexer_probe.py [OUT.json]``: prints one JSON line (also written to OUT); exits 0
only when the logits match. ``indexer_probe.py --nojit OUT.json``: in this fresh
process, time the first and steady decode steps and check DeepGEMM's JIT cache
is unchanged (``runtime.scoring.check_step_compiles_nothing``).
"""

import json
import os
import sys
import time
import traceback

import torch

if sys.argv[1:2] == ["--nojit"]:
    # --nojit OUT [--preload]: with --preload, a start-up preload_decode_rows (dummy steps at every row
    # count) first, so the measured first steps show what serving's first step costs.
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    import runtime
    from indexer_cases import make_state, make_step
    from runtime.indexer import SingleRank, decode_rows, preload_decode_rows
    from runtime.scoring import DeepGemmScorer, check_step_compiles_nothing

    runtime.load()  # the AOT cache loads at start-up, not in a step
    scorer = DeepGemmScorer()
    steps = {rows: make_step(rows, heads=64, head_dim=128, max_model_len=8192, k=512, max_rows=64,
                             device="cuda", seed=rows) for rows in (1, 16, 64)}
    out = {"preloaded": "--preload" in sys.argv}
    if out["preloaded"]:
        t0 = time.perf_counter()
        preload_decode_rows(make_state(steps[64], scorer=scorer))
        torch.cuda.synchronize()
        out["preload_s"] = time.perf_counter() - t0
    for rows, step in steps.items():
        state = make_state(step, scorer=scorer)
        try:
            out[rows] = check_step_compiles_nothing(
                lambda: decode_rows(state, step.metadata, step.q, step.weights, SingleRank()))
        except RuntimeError as exc:
            out[rows] = {"error": str(exc)}
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from benchmarks.common import gpu_info

    out["info"] = gpu_info()  # after the steps: its reads are no part of them
    print(json.dumps(out))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
    sys.exit(0 if all("error" not in v for v in out.values() if isinstance(v, dict)) else 1)

if sys.argv[1:2] == ["--step"]:  # one small decode step, for compute-sanitizer
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from indexer_cases import make_state, make_step
    from runtime import reference
    from runtime.indexer import SingleRank, decode_rows
    from runtime.scoring import DeepGemmScorer

    step = make_step(4, heads=64, head_dim=128, max_model_len=4096, k=512, candidates=512, device="cuda")
    scorer = DeepGemmScorer()
    state = make_state(step, scorer=scorer)
    decode_rows(state, step.metadata, step.q, step.weights, SingleRank())
    md, a = step.metadata, step.state_args
    logits = scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table,
                           scorer.schedule(md.seq_lens), a["max_model_len"])
    same = torch.equal(state.topk_indices[:4].sort(dim=1).values,
                       reference.decode_topk_reference(logits, md.seq_lens, 512).sort(dim=1).values)
    print(f"small decode step done; top-k equals the reference: {same}")
    sys.exit(0 if same else 1)

result = {"python": sys.version.split()[0], "torch": torch.__version__}
try:
    t0 = time.perf_counter()
    import deep_gemm

    result["deep_gemm"] = getattr(deep_gemm, "__version__", "?")
    result["deep_gemm_file"] = deep_gemm.__file__
    result["import_s"] = round(time.perf_counter() - t0, 2)
    result["num_sms"] = deep_gemm.get_num_sms()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from indexer_cases import make_step
    from runtime import reference
    from runtime.scoring import DeepGemmScorer

    step = make_step(6, heads=64, head_dim=128, max_model_len=1024, k=512, device="cuda")
    md, a = step.metadata, step.state_args
    scorer = DeepGemmScorer()
    t0 = time.perf_counter()
    schedule = scorer.schedule(md.seq_lens)
    torch.cuda.synchronize()
    result["schedule_first_s"] = round(time.perf_counter() - t0, 2)
    result["schedule_shape"] = list(schedule.shape)
    t0 = time.perf_counter()
    got = scorer.logits(step.q, step.weights, a["index_k_cache"], md.seq_lens, md.block_table, schedule,
                        a["max_model_len"])
    torch.cuda.synchronize()
    result["logits_first_s"] = round(time.perf_counter() - t0, 2)
    result["logits_shape_stride"] = [list(got.shape), list(got.stride()), str(got.dtype)]
    want = reference.indexer_logits_reference(step.q, step.weights, a["index_k_cache"], md.seq_lens,
                                              md.block_table, a["max_model_len"])
    valid = torch.arange(a["max_model_len"], device="cuda")[None, :] < md.seq_lens[:, None]
    result["max_abs_err"] = float((got.float() - want).abs()[valid].max())
    result["max_abs_logit"] = float(want[valid].abs().max())
    result["ok"] = result["max_abs_err"] <= 1e-3 * result["max_abs_logit"]  # FP8 MMA accumulation
except Exception as exc:  # report, do not hide
    result["ok"] = False
    result["error"] = f"{type(exc).__name__}: {exc}"
    result["traceback"] = traceback.format_exc()[-2000:]
print(json.dumps(result))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
sys.exit(0 if result["ok"] else 1)
