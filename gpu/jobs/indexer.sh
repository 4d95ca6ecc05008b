#!/usr/bin/env bash
# limit: 110
# Indexer flow (issue 5), final mode, most important first, each step bounded by what is left of the
# job's limit (ROUND_CAP where the round sets one, LIMIT where run_all.sh cut it):
#   1. restore DeepGEMM's JIT cache from .whl/dg_jit_cache.tgz (an earlier round's build artifact) and
#      warm it for the serving shapes (runtime.scoring.warm_deepgemm: compiles nothing when restored);
#   2. GPU tests: DeepGEMM logits vs reference, DeepGEMM + AOT top-k vs reference, sharded vs replicated,
#      a warm cache makes a fresh process's first step compile nothing;
#   3. the benchmark, all 9 sizes (INDEXER_QUICK=1: 3);
#   4. zero-JIT JSON for 1/16/64 rows: a cold process, and one after preload_decode_rows;
#   5. compute-sanitizer memcheck of one small decode step.
set -u
: "${JOB_OUT:?names the folder for the reports (e.g. JOB_OUT=\$OUT/<job>)}"
# A GPU test that would skip (no device seen, DeepGEMM unable to score) fails here, as in all_gpu_tests.sh: without it
# step 2 printed rc=0 over 24 skipped tests.
export SPARSE_DECODE_AOT_REQUIRE_GPU=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh  # DeepGEMM libraries, JIT cache dir, cache restored
mkdir -p "$JOB_OUT"  # a folder not made yet (JOB_OUT=$OUT/indexer): step 1 wrote into it before anything made it
# The least of its limit line, ROUND_CAP and a LIMIT that run_all.sh cut (which the steps ignored: a cut job was
# killed in its last step, reports and all).
limit=$(grep -m1 '^# limit:' "$0" | awk '{print $3}')
budget=$limit
for cut in ${ROUND_CAP:-} ${LIMIT:-}; do [ "$cut" -lt "$budget" ] && budget=$cut; done
left() { echo $(( budget - SECONDS - 4 )); }
steps=$(mktemp /tmp/indexer_steps.XXXXXX)  # each step's rc, a line each (a step in a pipeline runs in a subshell)
trap 'rm -f "$steps"' EXIT  # (removed at the end only: a job cut short by its limit left it)
step() {  # step MAX_SECONDS MIN_SECONDS command...: run with min(MAX, what is left), skip below MIN
  local max=$1 min=$2; shift 2; local t; t=$(left); [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt "$min" ]; then echo "SKIPPED (only ${t}s left): $*"; echo 99 >> "$steps"; return 99; fi
  echo "+ [${t}s] $*"; timeout "$t" "$@"; local rc=$?; echo "rc=$rc"; echo $rc >> "$steps"; return $rc
}
echo "nvcc: $(command -v nvcc) budget=${budget}s"
echo "=== 1. warm DeepGEMM's JIT cache (runtime.scoring.warm_deepgemm)"
step 60 5 python3 -c "
import json
from runtime.scoring import ServingShapes, warm_deepgemm
r = warm_deepgemm(ServingShapes(max_rows=64))
print(json.dumps(r)); json.dump(r, open('$JOB_OUT/warm.json', 'w'), indent=1)
"
[ -d $DG_JIT_CACHE_DIR ] && tar czf "$JOB_OUT/dg_jit_cache.tgz" -C /tmp dg_jit_cache
echo "=== 2. GPU tests"
# 21 tests took 21 s (verify_all_s51b.log); the fifty-second session added the zero-JIT test's compile of DeepGEMM
# from an empty cache (~10 s) and a 64K-context flow: 60 s. The whole output goes beside the reports.
step 60 10 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_indexer_gpu.py -rfEs -s --maxfail=4 2>&1 \
  | tee "$JOB_OUT/indexer_gpu_tests.log" | tail -30
echo "=== 3. benchmark"
if [ "${INDEXER_QUICK:-0}" = 1 ]; then q=--quick; else q=; fi
step 45 10 python3 benchmarks/bench_indexer.py $q --out "$JOB_OUT/bench_indexer.json"
echo "=== 4. zero JIT in fresh processes: cold first steps, then first steps after a start-up preload"
step 15 8 python3 gpu/jobs/indexer_probe.py --nojit "$JOB_OUT/no_jit.json"
step 15 8 python3 gpu/jobs/indexer_probe.py --nojit "$JOB_OUT/no_jit_preloaded.json" --preload
echo "=== 5. compute-sanitizer memcheck: one small decode step (DeepGEMM logits + AOT top-k)"
if command -v compute-sanitizer >/dev/null; then
  # Device faults only: the AOT loader's validation alone hits CUDA API errors (R3: 86 counted with them)
  # Every tensor its own allocation (gpu/tools/mla_sanitize.sh says why).
  step 30 12 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
    python3 gpu/jobs/indexer_probe.py --step 2>&1 | tail -6
else
  echo "SKIPPED (no compute-sanitizer on PATH): the step's memcheck did not run"; echo 99 >> "$steps"
fi
echo "=== job took ${SECONDS}s; cache $(find $DG_JIT_CACHE_DIR -type f 2>/dev/null | wc -l) files"
# The job's exit status (it was the echo's 0): every step ran and exited 0. A benchmark target missed is no failure
# (bench_indexer.py records it and exits 0); a size that raised (a selection unlike the reference's, a fault) is
# (it exits 1).
failed=$(grep -cvx 0 "$steps"); ran=$(wc -l < "$steps")
echo "indexer: $ran steps, $failed failed or skipped"
[ "$failed" -eq 0 ]
