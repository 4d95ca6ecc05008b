#!/usr/bin/env bash
# limit: 150
# decode_topk's 2-CTA twin on 64 x 256K FP32 under ncu (per-SASS stall samples), caches kept between launches
# (NCU_CACHE_CONTROL=none, inputs alternating), k 2048 and 512.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
NCU_CACHE_CONTROL=none stall_profile twin_k2048 decode_topk topk decode_topk_f32_token_c2_full_sm 64 262144 2048
NCU_CACHE_CONTROL=none stall_profile twin_k512 decode_topk topk decode_topk_f32_token_c2_full_sm 64 262144 512
