#!/usr/bin/env bash
# limit: 480
# The checks a tree needs after host-side changes and a kernel added beside unchanged ones (the seventy-fourth
# session's topk_pool_rows kernel; the other cubins byte for byte the same), most important first: every GPU test
# (all_gpu_tests.sh: runtime verify, then pytest -m gpu), topk_pool_rows' GPU tests under compute-sanitizer memcheck,
# the indexer's flow job (indexer.sh: DeepGEMM warmed, its GPU tests, the benchmark, zero JIT, memcheck), then
# topk_pool_rows' cost beside the torch chain, the floor and sparse_mla_decode (benchmarks/bench_pool_rows.py). Carry
# .whl (DeepGEMM's wheel). Results: $JOB_OUT/host_changes.tgz (each job's folder and log, bench_pool_rows.json, the
# verdict), packed after each step: a call brings back 8 files at most.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_CACHE=${SPARSE_DECODE_AOT_CACHE:-$PWD}
OUTDIR=${JOB_OUT:?}
mkdir -p "$OUTDIR"  # JOB_OUT=$OUT/<job> names a folder not made yet
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh): all_gpu_tests.sh is given it as its LIMIT,
# indexer.sh as its ROUND_CAP.
source gpu/tools/job_limit.sh
work=$(mktemp -d /tmp/host_changes.XXXXXX)
trap 'rm -rf "$work"' EXIT
pack() { tar czf "$OUTDIR/host_changes.tgz" -C "$work" .; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$work/gpu.txt"
failed=()
echo "=== every GPU test (${SECONDS}s)"
JOB_OUT=$work/tests LIMIT=$(cap 250) bash gpu/jobs/all_gpu_tests.sh > "$work/all_gpu_tests.log" 2>&1 \
  || failed+=("GPU tests")
tail -4 "$work/all_gpu_tests.log"; pack
echo "=== topk_pool_rows' kernel under memcheck (${SECONDS}s)"
bash gpu/tools/pool_rows_memcheck.sh "$(cap 90)" > "$work/pool_rows_memcheck.log" 2>&1 || failed+=("pool_rows memcheck")
tail -3 "$work/pool_rows_memcheck.log"; pack
echo "=== indexer flow (${SECONDS}s)"
JOB_OUT=$work/indexer ROUND_CAP=$(cap 110) bash gpu/jobs/indexer.sh > "$work/indexer.log" 2>&1 || failed+=("indexer")
tail -4 "$work/indexer.log"; pack
echo "=== topk_pool_rows' cost (${SECONDS}s)"
timeout "$(cap 45)" python3 benchmarks/bench_pool_rows.py --out "$work/bench_pool_rows.json" \
  > "$work/bench_pool_rows.log" 2>&1 || failed+=("bench_pool_rows")
tail -4 "$work/bench_pool_rows.log"
verdict="host_changes: every step passed"; [ ${#failed[@]} -eq 0 ] || verdict="host_changes: FAILED: ${failed[*]}"
echo "$verdict (${SECONDS}s)" | tee "$work/verdict.txt"
pack
[ ${#failed[@]} -eq 0 ]
