#!/usr/bin/env bash
# limit: 120
# decode_topk stall sampling at the finest interval (where the fixed cost of small rows goes).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile c16_1x64k decode_topk topk decode_topk_f32_token_c16 1 65536 2048
stall_profile c2_1x8k decode_topk topk decode_topk_f32_token_c2 1 8192 2048
stall_profile c2_64x256k decode_topk topk decode_topk_f32_token_c2 64 262144 2048
