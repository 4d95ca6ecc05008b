#!/usr/bin/env bash
# limit: 560
# The packed, range-checked launch (one struct.pack_into per launch) on a GPU: every GPU test, then the ops' eager
# host time against the runtime before it in one process (gpu/jobs/host_ab.py; the old tree carried as
# .whl/runtime_<rev>.tgz, `git archive <rev> runtime | gzip -n`), then the eager launch against a bare
# cuLaunchKernelEx (benchmarks/bench_runtime.py). On an H200 the benchmark grids follow (decode_topk, sparse MLA).
# Carry .whl. Results in $JOB_OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_CACHE=$PWD
OUTDIR=${JOB_OUT:?}
mkdir -p "$OUTDIR"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
OLD=${OLD_RUNTIME:?name the carried old runtime archive, e.g. .whl/runtime_cc8569f.tgz}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh): the GPU tests' 300 s, the host time's 200 and
# the launch's 120 came to 620 s against the job's 560, the H200 grids' 120 s more.
source gpu/tools/job_limit.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
echo "=== 1. every GPU test"
JOB_OUT=$OUTDIR LIMIT=$(cap 300) bash gpu/jobs/all_gpu_tests.sh 2>&1 | tail -6
source gpu/tools/deepgemm_env.sh >/dev/null
echo "=== 2. eager host time, $OLD against this tree, one process (${SECONDS}s)"
rm -rf ab && mkdir -p ab/old ab/new && tar -xzf "$OLD" -C ab/old && cp -r runtime ab/new/
timeout "$(cap 200)" python3 gpu/jobs/host_ab.py "$OUTDIR/host_ab.json" --blocks ${BLOCKS:-31} 2>&1 | tail -8
echo "=== 3. eager launch against a bare cuLaunchKernelEx (${SECONDS}s)"
timeout "$(cap 120)" python3 benchmarks/bench_runtime.py "$OUTDIR/runtime.json" --runs 7 --profile-runs 0 2>&1 | tail -4
python3 -c "
import json; d = json.load(open('$OUTDIR/runtime.json'))['launch_overhead']; print({k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()})"
if echo "$gpu" | grep -q H200; then
  bash gpu/tools/h200_grids.sh "$OUTDIR" "$SECONDS" "$(time_left)"
fi
echo "=== took ${SECONDS}s"
