#!/usr/bin/env bash
# limit: 560
# A session's last GPU call: every GPU test on the tree as it stands (runtime verify first), Kernel.launch's own host
# time against an older runtime (gpu/jobs/launch_micro.py; OLD_RUNTIME names its carried archive, `git archive REV
# runtime | gzip -n`), and on an H200 the decode_topk and sparse-MLA grids. Carry .whl. Results in $JOB_OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD} SPARSE_DECODE_AOT_CACHE=$PWD
OUTDIR=${JOB_OUT:?}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
python3 -c "from benchmarks.common import source_digest; print('host code digest', source_digest())" | tee "$OUTDIR/tree.txt"
if [ -n "${OLD_RUNTIME:-}" ]; then
  echo "=== launch host time, no-op driver (${SECONDS}s)"
  rm -rf /tmp/old_tree && mkdir -p /tmp/old_tree && tar -xzf "$OLD_RUNTIME" -C /tmp/old_tree
  for round in 1 2 3; do
    python3 gpu/jobs/launch_micro.py /tmp/old_tree; python3 gpu/jobs/launch_micro.py "$PWD"
  done | tee "$OUTDIR/launch_micro.jsonl"
fi
echo "=== every GPU test (${SECONDS}s)"
JOB_OUT=$OUTDIR bash gpu/jobs/all_gpu_tests.sh 2>&1 | tail -6
if echo "$gpu" | grep -q H200; then
  echo "=== decode_topk grid (${SECONDS}s)"
  timeout 120 python3 benchmarks/bench_topk.py --out "$OUTDIR/decode_topk.json" 2>&1 | tail -6
  left=$((${LIMIT:-560} - SECONDS - 10))
  if [ "$left" -gt 150 ]; then
    echo "=== sparse-MLA grid (${SECONDS}s)"
    timeout "$left" python3 benchmarks/bench_sparse_mla.py --out "$OUTDIR/bench_sparse_mla.json" 2>&1 | tail -14
  fi
fi
echo "=== took ${SECONDS}s"
