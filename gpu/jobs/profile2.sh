#!/usr/bin/env bash
# limit: 120
# decode_topk stall sampling at the finest interval (where the fixed cost of small rows goes).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # tag args...
  local tag=$1; shift
  echo "+ $tag"
  timeout 40 "$NCU" --clock-control none --kernel-name regex:decode_topk --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SpeedOfLight --warp-sampling-interval 0 \
    --import-source no -f -o "$JOB_OUT/$tag" python3 gpu/jobs/profile_cases.py "$@" > "$JOB_OUT/$tag.ncu.log" 2>&1
  echo "rc=$?"
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/$tag.sass.csv" 2>&1
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page details > "$JOB_OUT/$tag.details.txt" 2>&1
  grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/$tag.details.txt"; rm -f "$JOB_OUT/$tag.ncu-rep"
}
prof c16_1x64k topk decode_topk_f32_token_c16 1 65536 2048
prof c2_1x8k topk decode_topk_f32_token_c2 1 8192 2048
prof c2_64x256k topk decode_topk_f32_token_c2 64 262144 2048
