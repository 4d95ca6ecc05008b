#!/usr/bin/env bash
# limit: 150
# sparse_mla_decode checks of a final tree: the AOT kernel's and the runtime's GPU tests (mla_tests.sh),
# then compute-sanitizer memcheck/racecheck/synccheck on small launches of both widths with and without
# sinks (gpu/tools/mla_sanitize.sh). The benchmark is gpu/jobs/mla_bench.sh (run it after this job).
set -u
# gpu/tools/mla_sanitize.sh writes into JOB_OUT: without it, the tests ran first and then "FAILED: sanitizers"
: "${JOB_OUT:?names the folder for the reports (e.g. JOB_OUT=\$OUT/<job>)}"
export PYTHONPATH=${PYTHONPATH:-$PWD}
failed=()
bash gpu/jobs/mla_tests.sh || failed+=("tests")
bash gpu/tools/mla_sanitize.sh 50 || failed+=("sanitizers")
verdict="mla_final: every step passed"; [ ${#failed[@]} -eq 0 ] || verdict="mla_final: FAILED: ${failed[*]}"
echo "$verdict"
[ ${#failed[@]} -eq 0 ]
