#!/usr/bin/env bash
# limit: 200
# Lead's last sanitizer pass for what R3 left open: memcheck (device faults only) of one indexer
# decode step (DeepGEMM logits + AOT top-k), and a decode_topk racecheck given time to finish.
set -u
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
S=/usr/local/cuda/bin/compute-sanitizer
echo "=== indexer step, memcheck (device faults only)"
timeout 70 $S --tool memcheck --report-api-errors no --print-limit 10 python3 gpu/jobs/indexer_probe.py --step 2>&1 | tail -6
echo "=== decode_topk, racecheck"
timeout 110 $S --tool racecheck --racecheck-report all --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -14
