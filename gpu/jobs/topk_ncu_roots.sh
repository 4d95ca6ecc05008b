#!/usr/bin/env bash
# limit: 240
# decode_topk under ncu (per-SASS stall samples) on the committed cache and on .gl/cand, for the
# long-row shapes whose step 1 dominates: 1 x 1M on 16 CTAs and 64 x 256K on 2 (FP32, k 2048).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile base_c16_1x1m decode_topk topk decode_topk_f32_token_c16 1 1048576 2048
SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand stall_profile cand_c16_1x1m decode_topk topk decode_topk_f32_token_c16 1 1048576 2048
stall_profile base_c2_64x256k decode_topk topk decode_topk_f32_token_c2 64 262144 2048
SPARSE_DECODE_AOT_CACHE=$PWD/.gl/cand stall_profile cand_c2_64x256k decode_topk topk decode_topk_f32_token_c2 64 262144 2048
