#!/usr/bin/env bash
# limit: 200
# Short slices (the CTA-tile step 1): per-phase clocks with step 1's first tile split (.gl/tl_s1, built with
# DECODE_TOPK_EXPERIMENT=timeline_step1; .gl/tl_nc the same with every histogram atomic sent to its own bin, a
# timing probe of atomic contention whose selections are wrong; built from a local one-line patch of step 1's
# atomic address that is not in the tree), and ncu stall sampling of the committed cache.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Cut to what is left of the limit as the profiles below are (gpu/tools/job_limit.sh; 160 s of its 200 in all).
source gpu/tools/job_limit.sh
for root in .gl/tl_s1 .gl/tl_nc; do
  echo "== $root"
  TOPK_TIMELINE_MARKS=step1 timeout "$(cap 30)" python3 gpu/jobs/topk_timeline.py "$root" \
    "$JOB_OUT/timeline_$(basename "$root").json"
done
source gpu/tools/ncu_stalls.sh
stall_profile base_c2_64x8k decode_topk topk decode_topk_f32_token_c2 64 8192 512
stall_profile base_c4_1x16k decode_topk topk decode_topk_f32_token_c4 1 16384 2048
