#!/usr/bin/env bash
# limit: 300
# Every GPU test of the repository on the committed tree (runtime, sparse MLA, decode_topk, indexer with DeepGEMM
# from the carried .whl), after the loader's own verification of the cache against the device.
set -uo pipefail
# JOB_OUT=$OUT/<job> names a folder not made yet: tee could not write the logs into it, and with pipefail its failure
# failed both steps, which had passed.
mkdir -p "${JOB_OUT:-/tmp}"
export SPARSE_DECODE_AOT_REQUIRE_GPU=1  # a GPU test that would skip fails here
export PYTHONPATH=${PYTHONPATH:-$PWD}
source gpu/tools/deepgemm_env.sh
# Its two steps cut to what is left of LIMIT less 10 s (gpu/tools/job_limit.sh): its own 300, or what a job that runs
# it has left. Alone, 30 + 260 s as before, pytest's cut only where the steps before it took more than 30 s.
source gpu/tools/job_limit.sh
# Which tests ran: the host code digest (benchmarks.common.source_digest) leaves tests/ out, and the device copy's git
# head may be stale. `find tests -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum` of a checkout matches it
# (LC_ALL=C: the GPU machine's locale sorts test_indexer_gpu.py before test_indexer.py).
echo "tests digest $(find tests -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)" \
  | tee "${JOB_OUT:-/tmp}/tests_digest.txt"
# Its whole report beside the job's (the tail shows its verdict; a failed check's line may sit above it).
# Bounded (it takes seconds; a hung probe launch would take the job's whole limit), with pytest's 260 s inside the 300.
timeout "$(cap "${VERIFY_LIMIT:-30}")" python3 -m runtime verify 2>&1 | tee "${JOB_OUT:-/tmp}/runtime_verify.log" \
  | tail -3
verify_rc=$?  # (pipefail: verify's own, 124 where it timed out)
# -rfEs: the failures' and errors' names in the summary too (-rs alone names the skips only); the whole output
# goes to a file beside the job's reports, since the tail below keeps one traceback's end at most.
timeout "$(cap 260)" python3 -m pytest -q -p no:cacheprovider -m gpu tests/ -rfEs 2>&1 \
  | tee "${JOB_OUT:-/tmp}/all_gpu_tests_pytest.log" | tail -15
pytest_rc=$?
# The job's exit status fails where either did (it followed pytest alone: a failed `runtime verify` exited 0), and
# says which: 124 is the timeout's, 5 pytest's "no tests ran".
echo "all_gpu_tests: runtime verify rc=$verify_rc, pytest rc=$pytest_rc"
[ "$verify_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ]
