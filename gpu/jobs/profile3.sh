#!/usr/bin/env bash
# limit: 150
# decode_topk stall sampling at the finest interval: short rows (1 x 8K, 1 x 64K: where the fixed cost
# goes), a CTA-tile slice (1 x 256K on 16 CTAs) and warp-loop slices (64 x 256K on 2 CTAs a row, BF16
# 1 x 1M): per-SASS-instruction samples and shared-memory wavefronts.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh  # (its five profiles' 50 s each, cut to what is left of the limit: 250 s against 150)
stall_profile c2_1x8k decode_topk topk decode_topk_f32_token_c2 1 8192 2048
stall_profile c16_1x64k decode_topk topk decode_topk_f32_token_c16 1 65536 2048
stall_profile c16_1x256k decode_topk topk decode_topk_f32_token_c16 1 262144 2048
stall_profile c2_64x256k decode_topk topk decode_topk_f32_token_c2 64 262144 2048
stall_profile bf16_c16_1x1m decode_topk topk decode_topk_bf16_token_c16 1 1048576 2048
