#!/usr/bin/env bash
# limit: 120
# decode_topk on 8 x 64K k512 (8 CTAs a row, two resident tiles a CTA: the indexer's 8 x 64K case) under ncu: stall
# samples per SASS instruction, to find what the no-list gather pass (~3.5K cycles in the timelines) waits on;
# 1 x 64K on 16 CTAs (one resident tile) beside it.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile f32_c8_8x64k_k512 decode_topk topk decode_topk_f32_token_c8 8 65536 512
stall_profile f32_c16_1x64k_k512 decode_topk topk decode_topk_f32_token_c16 1 65536 512
