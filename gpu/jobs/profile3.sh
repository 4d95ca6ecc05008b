#!/usr/bin/env bash
# limit: 150
# decode_topk stall sampling at the finest interval on a CTA-tile slice (1 x 256K on 16 CTAs) and a
# warp-loop slice (64 x 256K on 2 CTAs a row): per-SASS-instruction samples for where step 1's time goes.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # tag args...
  local tag=$1; shift
  echo "+ $tag"
  timeout 50 "$NCU" --clock-control none --kernel-name regex:decode_topk --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SpeedOfLight --section Occupancy \
    --section LaunchStats --warp-sampling-interval 0 \
    --import-source no -f -o "$JOB_OUT/$tag" python3 gpu/jobs/profile_cases.py "$@" > "$JOB_OUT/$tag.ncu.log" 2>&1
  echo "rc=$?"
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/$tag.sass.csv" 2>&1
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page details > "$JOB_OUT/$tag.details.txt" 2>&1
  grep -m2 "Duration\|Elapsed Cycles" "$JOB_OUT/$tag.details.txt"; rm -f "$JOB_OUT/$tag.ncu-rep"
}
prof c16_1x256k topk decode_topk_f32_token_c16 1 262144 2048
prof c2_64x256k topk decode_topk_f32_token_c2 64 262144 2048
prof bf16_c16_1x1m topk decode_topk_bf16_token_c16 1 1048576 2048
