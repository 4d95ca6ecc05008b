#!/usr/bin/env bash
# limit: 120
# decode_topk per-phase clocks (timeline build carried in .gl/tl, or TL_ROOT) on the indexer benchmark's shapes: its
# DeepGEMM logits beside random ones (gpu/jobs/topk_timeline.py, TOPK_TIMELINE_INPUT=indexer).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
# Alone, 100 s of its 120; run by another job, what that job has left (gpu/tools/job_limit.sh).
source gpu/tools/job_limit.sh
root=${TL_ROOT:-.gl/tl}
TOPK_TIMELINE_INPUT=indexer timeout "$(cap 100)" python3 gpu/jobs/topk_timeline.py "$root" \
  "$JOB_OUT/timeline_indexer${TL_ROOT:+_$(basename "$root")}.json"
