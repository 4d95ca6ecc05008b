#!/usr/bin/env bash
# limit: 200
# Lead's last sanitizer pass for what R3 left open: memcheck (device faults only) of one indexer
# decode step (DeepGEMM logits + AOT top-k), and a decode_topk racecheck given time to finish.
set -uo pipefail  # a step's failure is its status, not tail's
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
S=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
failed=()
echo "=== indexer step, memcheck (device faults only)"
timeout 70 $S --tool memcheck --report-api-errors no --error-exitcode 3 --print-limit 10 \
  python3 gpu/jobs/indexer_probe.py --step 2>&1 | tail -6 || failed+=("indexer memcheck")
echo "=== decode_topk, racecheck"
# Judged by its summary (racecheck's status is 0 or, where it warns, 3; anything else is a crash or a timeout)
report=$(mktemp /tmp/final_racecheck.XXXXXX)
timeout 110 $S --tool racecheck --racecheck-report all --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick \
  > "$report" 2>&1
rc=$?
tail -14 "$report"
{ [ $rc -eq 0 ] || [ $rc -eq 3 ]; } && grep -qE "RACECHECK SUMMARY: .*\(0 errors" "$report" \
  || failed+=("decode_topk racecheck (rc=$rc)")
rm -f "$report"
[ ${#failed[@]} -eq 0 ] || echo "final_sanitize: FAILED: ${failed[*]}"
[ ${#failed[@]} -eq 0 ]
