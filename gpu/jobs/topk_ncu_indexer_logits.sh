#!/usr/bin/env bash
# limit: 120
# decode_topk under ncu (per-SASS stall samples) on the indexer benchmark's DeepGEMM logits (positive head weights),
# as topk_ncu_indexer.sh does on random ones: 8 x 64K FP32 k512 on 8 CTAs and the short-row kernel at 1 x 8K. Caches
# kept between launches. Read CTA 0's finish from the instructions executed once a warp of CTA 0 (rows x 16 times).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
source gpu/tools/ncu_stalls.sh
export NCU_CACHE_CONTROL=${NCU_CACHE_CONTROL:-none}
stall_profile c8_8x64k_indexer decode_topk topk decode_topk_f32_token_c8 8 65536 512 indexer
stall_profile row_1x8k_indexer decode_topk topk decode_topk_f32_token_row 1 8192 512 indexer
