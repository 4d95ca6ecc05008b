#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck (in parallel, each under SECONDS_EACH, the first
# argument) on gpu/jobs/mla_support_sanitize.py's small launches of both widths with and without sinks;
# full reports to $JOB_OUT/sanitizer_<tool>.txt, their tails and a verdict to stdout. Shared by mla_support.sh and
# mla_final.sh.
set -u
: "${JOB_OUT:?names the folder for the reports (e.g. JOB_OUT=\$OUT/<job>)}"
t=${1:-50}
mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
echo "== compute-sanitizer memcheck, racecheck, synccheck (in parallel)"
# --report-api-errors no: cuda.bindings probes driver entry points at import (cuGetProcAddress_v2 answers
# CUDA_ERROR_INVALID_VALUE for the ones this driver lacks: 34 host-side "errors", in every run since the
# twenty-fourth session); the summary then counts only what the kernels do.
# PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own allocation, so that a read past a pool's end is outside any
# allocation memcheck knows (inside torch's cached block it would be a valid address; fifty-second session's review).
for tool in memcheck racecheck synccheck; do
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$t" compute-sanitizer --tool "$tool" --report-api-errors no \
      --error-exitcode 3 python3 gpu/jobs/mla_support_sanitize.py 5 > "$JOB_OUT/sanitizer_$tool.txt" 2>&1
    echo "rc=$?" >> "$JOB_OUT/sanitizer_$tool.txt" ) &
done
for tool in memcheck racecheck synccheck; do wait -n; done
# The verdict reads each report whole, not its tail (a launch's non-finite output in the first lines was out of the
# tail's sight): report_clean's summary, rc and the script's own "N/N launches finite", as topk_sanitize_full.sh's does.
source gpu/tools/sanitizer_verdict.sh
clean=0
for tool in memcheck racecheck synccheck; do
  f="$JOB_OUT/sanitizer_$tool.txt"
  echo "-- $tool"; tail -n 7 "$f"
  report_clean "$f" "$tool" "launches finite" && clean=$((clean + 1))
done
echo "verdict: $clean of 3 tools clean (0 sanitizer errors, every launch finite)"
[ "$clean" -eq 3 ]  # the exit status too (it was the echo's 0)
