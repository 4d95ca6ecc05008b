#!/usr/bin/env bash
# limit: 60
# decode_topk per-phase clocks from carried timeline builds (.gl/tl_*: DECODE_TOPK_EXPERIMENT=timeline), one
# process each.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# The checkout's packages on the path: outside run_all.sh, which exports it, the scripts failed to import benchmarks
# and tests.
export PYTHONPATH=${PYTHONPATH:-$PWD}
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
# Each build's 25 s cut to what is left of the limit (gpu/tools/job_limit.sh; a job that runs this one passes what it
# has left): three builds or more add up past its 60.
source gpu/tools/job_limit.sh
for root in .gl/tl_*; do
  echo "== $root"
  timeout "$(cap 25)" python3 gpu/jobs/topk_timeline.py "$root" "$JOB_OUT/topk_timeline_$(basename "$root").json"
done
