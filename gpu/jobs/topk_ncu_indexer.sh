#!/usr/bin/env bash
# limit: 150
# decode_topk under ncu (per-SASS stall samples) on the committed cache at the indexer benchmark's small sizes, whose
# selection share misses its target: 8 x 64K FP32 k512 on 8 CTAs (two tiles a CTA in registers, no list) and the
# short-row kernel at 1 x 8K and 8 x 8K FP32 k512. Caches kept between launches (NCU_CACHE_CONTROL=none): the
# indexer's logits come hot from DeepGEMM's scoring. Random FP32 logits, or with TOPK_NCU_INPUT=indexer the indexer
# benchmark's DeepGEMM logits (positive head weights; tags end in _indexer). Read CTA 0's finish from the
# instructions executed once a warp of CTA 0 (rows x 16 times).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
export NCU_CACHE_CONTROL=${NCU_CACHE_CONTROL:-none}
input=() tag=""
if [ "${TOPK_NCU_INPUT:-random}" = indexer ]; then
  source gpu/tools/deepgemm_env.sh
  input=(indexer) tag=_indexer
fi
stall_profile c8_8x64k$tag decode_topk topk decode_topk_f32_token_c8 8 65536 512 ${input[@]+"${input[@]}"}
stall_profile row_1x8k$tag decode_topk topk decode_topk_f32_token_row 1 8192 512 ${input[@]+"${input[@]}"}
stall_profile row_8x8k$tag decode_topk topk decode_topk_f32_token_row 8 8192 512 ${input[@]+"${input[@]}"}
