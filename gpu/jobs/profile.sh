#!/usr/bin/env bash
# limit: 240
# Nsight Compute of decode_topk and sparse_mla_decode cases: details + per-SASS-instruction stall samples.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# Each profile's 60 s cut to what is left of the limit (gpu/tools/job_limit.sh): the six came to 360 s against its 240.
source gpu/tools/job_limit.sh
prof() {  # tag regex args...
  local tag=$1 rx=$2; shift 2
  echo "+ $tag"
  timeout "$(cap 60)" "$NCU" --clock-control none --kernel-name "regex:$rx" --launch-skip 2 --launch-count 1 \
    --set full --import-source no -f -o "$JOB_OUT/$tag" python3 gpu/jobs/profile_cases.py "$@" \
    > "$JOB_OUT/$tag.ncu.log" 2>&1
  echo "rc=$?"; tail -3 "$JOB_OUT/$tag.ncu.log"
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page details > "$JOB_OUT/$tag.details.txt" 2>&1
  "$NCU" -i "$JOB_OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$JOB_OUT/$tag.sass.csv" 2>&1
  grep -m3 "Duration\|Elapsed Cycles" "$JOB_OUT/$tag.details.txt"
  rm -f "$JOB_OUT/$tag.ncu-rep"
}
prof topk_f32_c1_1x16k decode_topk topk decode_topk_f32_token_c1 1 16384 2048
prof topk_f32_c16_1x64k decode_topk topk decode_topk_f32_token_c16 1 65536 2048
prof topk_f32_c8_1x64k decode_topk topk decode_topk_f32_token_c8 1 65536 2048
prof topk_f32_c2_64x256k decode_topk topk decode_topk_f32_token_c2 64 262144 2048
prof topk_bf16_c8_8x64k decode_topk topk decode_topk_bf16_token_c8 8 65536 2048
prof mla_t12_w640 sparse_mla mla 12 640
