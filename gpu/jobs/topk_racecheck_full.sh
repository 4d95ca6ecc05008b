#!/usr/bin/env bash
# limit: 420
# decode_topk racecheck in full mode (every cluster size, the twins, the short-row kernel; randn, equal and tied
# rows): one process took over 230 s, so the cases run as SHARDS interleaved processes side by side.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
n=${SHARDS:-6}
for ((i = 0; i < n; i++)); do
  ( timeout ${SECONDS_EACH:-400} /usr/local/cuda/bin/compute-sanitizer --tool racecheck --racecheck-report all \
      --report-api-errors no --error-exitcode 3 --print-limit 4 python3 gpu/jobs/topk_sanitize.py --shard=$i/$n \
      > "$JOB_OUT/topk_racecheck_$i.txt" 2>&1; echo "rc=$?" >> "$JOB_OUT/topk_racecheck_$i.txt" ) &
done
wait
for ((i = 0; i < n; i++)); do echo "-- shard $i/$n"; grep -E "cases match|SUMMARY|rc=|MISMATCH" "$JOB_OUT/topk_racecheck_$i.txt"; done
echo "took ${SECONDS}s"
