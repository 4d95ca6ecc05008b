#!/usr/bin/env bash
# limit: 130
# decode_topk's BF16 k2048 rows (the benchmark's largest misses) under ncu: stall samples and executions per SASS
# instruction, for the marked gather's rounds (gather_marked) and CTA 0's finish: 64 x 256K on the 2-CTA twin,
# 1 x 256K on 16 CTAs.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile bf16_c2twin_64x256k decode_topk topk decode_topk_bf16_token_c2_full_sm 64 262144 2048
stall_profile bf16_c16_1x256k decode_topk topk decode_topk_bf16_token_c16 1 262144 2048
