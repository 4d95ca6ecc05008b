#!/usr/bin/env bash
# limit: 120
# decode_topk stall sampling at the finest interval of 8 rows of 1M on 8 CTAs (BF16 k2048: the last cell under 5x
# torch.topk; BF16 k512 and FP32 k2048 beside it): per-SASS-instruction samples and shared-memory wavefronts.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile bf16_c8_8x1m_k2048 decode_topk topk decode_topk_bf16_token_c8 8 1048576 2048
stall_profile f32_c8_8x1m_k2048 decode_topk topk decode_topk_f32_token_c8 8 1048576 2048
