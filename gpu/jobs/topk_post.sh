#!/usr/bin/env bash
# limit: 200
# decode_topk after a kernel change: GPU tests (every variant too) and compute-sanitizer on the committed
# cache, then ncu stall sampling of two short-row cases whose time is mostly after step 1
# (1 x 64K on 16 CTAs, 1 x 16K on 4), for the phases after step 1.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which both tools source): the checks' 205 s and
# the two profiles' 50 each came to 305 s against its 200.
source gpu/tools/topk_checks.sh
source gpu/tools/ncu_stalls.sh
topk_checks
stall_profile c16_1x64k decode_topk topk decode_topk_f32_token_c16 1 65536 2048
stall_profile c4_1x16k decode_topk topk decode_topk_f32_token_c4 1 16384 2048
