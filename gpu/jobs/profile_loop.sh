#!/usr/bin/env bash
# limit: 130
# decode_topk step 1's warp loop under ncu: issue-slot use and per-SASS-instruction executions on the
# two long-row shapes whose step 1 dominates (64 x 256K on 2 CTAs a row, 1 x 1M on 16).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile c2_64x256k decode_topk topk decode_topk_f32_token_c2 64 262144 2048
stall_profile c16_1x1m decode_topk topk decode_topk_f32_token_c16 1 1048576 2048
