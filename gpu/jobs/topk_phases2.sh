#!/usr/bin/env bash
# limit: 200
# decode_topk: phase-stop builds (.gl/stopN from gpu/jobs/make_stop_builds.py, carried) timed beside the
# committed cache, then stall sampling of three cases of the committed cache (gpu/jobs/profile3.sh).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh), profile3.sh given what is left as its own: the
# A/B's 100 s and profile3.sh's 150 (its five profiles' own 50 s each: 250) came to more than its 200.
source gpu/tools/job_limit.sh
roots=(.); for r in .gl/stop9 .gl/stop1 .gl/stop2 .gl/stop3; do [ -d "$r" ] && roots+=("$r"); done
echo "+ roots ${roots[*]}"
timeout "$(cap 100)" python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_phases.json" "${roots[@]}" 2>&1 | tail -20
LIMIT=$(cap 150) bash gpu/jobs/profile3.sh
