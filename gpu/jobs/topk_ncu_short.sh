#!/usr/bin/env bash
# limit: 150
# decode_topk under ncu (per-SASS stall samples) on the committed cache: short slices on 16 CTAs (1 x 64K: one tile
# a CTA, its keys kept in registers; 1 x 256K: four tiles, re-read), FP32 k2048, for the gather pass.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile c16_1x64k decode_topk topk decode_topk_f32_token_c16 1 65536 2048
stall_profile c16_1x256k decode_topk topk decode_topk_f32_token_c16 1 262144 2048
