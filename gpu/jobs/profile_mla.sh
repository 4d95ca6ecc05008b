#!/usr/bin/env bash
# limit: 120
# sparse_mla_decode stall sampling at the finest interval, width 640 and 128 at T = 12: per-SASS-instruction
# samples and shared-memory wavefronts (bank conflicts).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # tag args...
  local tag=$1; shift
  echo "+ $tag"
  timeout 50 "$NCU" --clock-control none --kernel-name regex:sparse_mla --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --warp-sampling-interval 0 \
    --import-source no -f -o "$JOB_OUT/$tag" python3 gpu/jobs/profile_cases.py "$@" > "$JOB_OUT/$tag.ncu.log" 2>&1
  echo "rc=$?"
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/$tag.sass.csv" 2>&1
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page details > "$JOB_OUT/$tag.details.txt" 2>&1
  grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/$tag.details.txt"; rm -f "$JOB_OUT/$tag.ncu-rep"
}
prof mla_t12_w640 mla 12 640
prof mla_t12_w128 mla 12 128
