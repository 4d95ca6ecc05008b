#!/usr/bin/env bash
# limit: 560
# A session's last GPU call: every GPU test on the tree as it stands (runtime verify first), Kernel.launch's own host
# time against an older runtime (gpu/jobs/launch_micro.py; OLD_RUNTIME names its carried archive, `git archive REV
# runtime | gzip -n`), and on an H200 the decode_topk and sparse-MLA grids; elsewhere, where LOAD_AB_TREE names an
# older whole tree (`git archive REV runtime benchmarks manifests cubins | gzip -n`), runtime.load() in fresh
# processes of that tree and of this one, one round each (its own cubins and manifests for each). Carry .whl.
# Results in $JOB_OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_CACHE=$PWD
OUTDIR=${JOB_OUT:?}
mkdir -p "$OUTDIR"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh): the GPU tests' 300 s and the two load rounds'
# 150 each came to 600 s against the job's 560.
source gpu/tools/job_limit.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
python3 -c "from benchmarks.common import source_digest; print('host code digest', source_digest())" | tee "$OUTDIR/tree.txt"
if [ -n "${OLD_RUNTIME:-}" ]; then
  echo "=== launch host time, no-op driver (${SECONDS}s)"
  rm -rf /tmp/old_tree && mkdir -p /tmp/old_tree && tar -xzf "$OLD_RUNTIME" -C /tmp/old_tree
  for round in 1 2 3; do
    timeout "$(cap 30)" python3 gpu/jobs/launch_micro.py /tmp/old_tree
    timeout "$(cap 30)" python3 gpu/jobs/launch_micro.py "$PWD"
  done | tee "$OUTDIR/launch_micro.jsonl"
fi
echo "=== every GPU test (${SECONDS}s)"
failed=()
JOB_OUT=$OUTDIR LIMIT=$(cap 300) bash gpu/jobs/all_gpu_tests.sh 2>&1 | tail -6 || failed+=("GPU tests")
if echo "$gpu" | grep -q H200; then
  bash gpu/tools/h200_grids.sh "$OUTDIR" "$SECONDS" "$(time_left)"
fi
if ! echo "$gpu" | grep -q H200 && [ -n "${LOAD_AB_TREE:-}" ]; then
  echo "=== runtime.load() in fresh processes, $LOAD_AB_TREE then this tree (${SECONDS}s)"
  rm -rf /tmp/load_old && mkdir -p /tmp/load_old && tar -xzf "$LOAD_AB_TREE" -C /tmp/load_old
  (cd /tmp/load_old && SPARSE_DECODE_AOT_CACHE=/tmp/load_old PYTHONPATH=/tmp/load_old timeout "$(cap 150)" python3 \
     benchmarks/bench_runtime.py "$OUTDIR/load_old.json" --runs 7 --profile-runs 0 --cold-only 2>&1 | tail -2)
  timeout "$(cap 150)" python3 benchmarks/bench_runtime.py "$OUTDIR/load_new.json" --runs 7 --profile-runs 0 \
    --cold-only 2>&1 | tail -2
  for f in "$OUTDIR"/load_old.json "$OUTDIR"/load_new.json; do
    python3 -c "
import json, sys; c = json.load(open(sys.argv[1]))['cold_start']
print(sys.argv[1].rsplit('/', 1)[1], {m: round(c[m]['load_ms_median'], 1) for m in c if isinstance(c[m], dict) and 'load_ms_median' in c[m]})" "$f"
  done
fi
echo "=== took ${SECONDS}s"
# The exit status is the GPU tests' (the timings' steps are read from their logs; it was the echo's 0).
[ ${#failed[@]} -eq 0 ] || echo "session_close: FAILED: ${failed[*]}"
[ ${#failed[@]} -eq 0 ]
