#!/usr/bin/env bash
# limit: 120
# sparse_mla_decode stall sampling at the finest interval, width 640 and 128 at T = 12: per-SASS-instruction
# samples and shared-memory wavefronts (bank conflicts).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/ncu_stalls.sh
stall_profile mla_t12_w640 sparse_mla mla 12 640
stall_profile mla_t12_w128 sparse_mla mla 12 128
