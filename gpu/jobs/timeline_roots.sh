#!/usr/bin/env bash
# limit: 150
# decode_topk per-phase clocks (gpu/jobs/topk_timeline.py) of each carried timeline build TL_ROOTS names (default:
# every .gl/tl_*) on TOPK_TIMELINE_CASES (TOPK_TIMELINE_COLD=1: logits out of L2, as in the benchmark); a build whose
# name holds "gather" or "refine" (DECODE_TOPK_EXPERIMENT=timeline_gather, timeline_refine) is parsed with those marks.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each build's 60 s cut to what is left of the limit (gpu/tools/job_limit.sh; a job that runs this one passes what it
# has left): three builds or more add up past its 150.
source gpu/tools/job_limit.sh
for root in ${TL_ROOTS:-$(ls -d .gl/tl_* 2>/dev/null)}; do
  marks=""
  case $root in *gather*) marks=gather ;; *refine*) marks=refine ;; esac
  echo "=== $root (${TOPK_TIMELINE_CASES:-default} cases, cold=${TOPK_TIMELINE_COLD:-0})"
  out="$JOB_OUT/timeline_$(basename "$root").json"
  TOPK_TIMELINE_MARKS=$marks timeout "$(cap 60)" python3 gpu/jobs/topk_timeline.py "$root" "$out" 2>&1 \
    | grep -v "^    .*min       0"
done
