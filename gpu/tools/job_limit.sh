# Sourced by the jobs whose steps' own timeouts could add up past their `# limit:` line (and by topk_checks.sh and
# ncu_stalls.sh for their steps): run_all.sh cuts a job off at that line, a device call at 600 s, and whatever the job
# had not written by then was lost. LIMIT: the job's seconds, its own limit line unless the caller passes LIMIT (a
# job run by another is given what is left of the caller's: `LIMIT=$(cap N) bash gpu/jobs/X.sh`); it is not passed
# on otherwise, so that a job run by this one reads its own line. `cap N`: a step's timeout, N or what is left of LIMIT
# less 10 s (to pack and report), whichever is less, at least 1 (`timeout 0` would not time out at all). Steps run as
# `timeout "$(cap N)" ...` thus end by LIMIT - 10 in all (past it, a second each), while each keeps its own N wherever
# the steps before it left the time; `time_left` is what cap leaves without a step's own bound.
if [ -z "${LIMIT:-}" ]; then
  LIMIT=$(grep -m1 '^# limit:' "$0" 2>/dev/null | awk '{print $3}')
  LIMIT=${LIMIT:-120}  # (run_all.sh's default for a job without the line)
fi
export -n LIMIT
time_left() { local left=$((LIMIT - 10 - SECONDS)); echo $((left < 1 ? 1 : left)); }
cap() { local left; left=$(time_left); echo $((left < $1 ? left : $1)); }
