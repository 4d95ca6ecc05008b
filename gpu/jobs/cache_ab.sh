#!/usr/bin/env bash
# limit: 560
# A cubin change against the cache before it: every GPU test and decode_topk's sanitizers on the tree (the new
# cubins), then the decode_topk and indexer benchmarks of the new cache and of the previous one (.gl/old, e.g.
# `git archive HEAD cubins manifests` before the rebuild is committed), one process each, on the same machine.
# (Twenty-ninth session: select_release.sh; generic since the thirtieth.)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
JOB_OUT=${JOB_OUT:?}
mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# Each step cut to what is left of the limit: the GPU tests' 300 s, the sanitizers' 3 x 60 and the benchmarks' 360 came
# to 840 s against the job's 560 (a call's 600).
source gpu/tools/job_limit.sh
LIMIT=$(cap 300) bash gpu/jobs/all_gpu_tests.sh > "$JOB_OUT/all_gpu_tests.log" 2>&1
tail -4 "$JOB_OUT/all_gpu_tests.log"
source gpu/tools/deepgemm_env.sh
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# The three logs in one file: with one each, the job left 9 files, one more than a device call returns (device call
# 3 lost topk_old.json; call 4 re-ran both benchmarks).
for tool in memcheck synccheck racecheck; do
  echo "=== $tool" >> "$JOB_OUT/sanitizers.log"
  timeout "$(cap 60)" "$san" --tool $tool --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick \
    >> "$JOB_OUT/sanitizers.log" 2>&1
  echo "$tool rc=$?"; tail -2 "$JOB_OUT/sanitizers.log"
done
timeout "$(cap 120)" python3 benchmarks/bench_topk.py --out "$JOB_OUT/topk_new.json" --budget 150 --no-sweep | tail -2
SPARSE_DECODE_AOT_CACHE=$PWD/.gl/old timeout "$(cap 120)" python3 benchmarks/bench_topk.py \
  --out "$JOB_OUT/topk_old.json" --budget 150 --no-sweep | tail -2
timeout "$(cap 60)" python3 benchmarks/bench_indexer.py --out "$JOB_OUT/indexer_new.json" | tail -12
SPARSE_DECODE_AOT_CACHE=$PWD/.gl/old timeout "$(cap 60)" python3 benchmarks/bench_indexer.py \
  --out "$JOB_OUT/indexer_old.json" | tail -12
