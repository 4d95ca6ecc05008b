#!/usr/bin/env bash
# limit: 560
# A candidate tree's checks (CAND=NAME: .whl/NAME.tgz from gpu/tools/candidate_tree.sh; carry .whl), run from the
# candidate tree: the loader's verification, decode_topk's and the indexer's GPU tests, then decode_topk's three
# sanitizers in full mode side by side (racecheck in 8 shards), as gpu/jobs/verify_all.sh runs them on the checkout.
# Its timing is gpu/jobs/tree_ab.sh. Reports in $JOB_OUT/tree_checks.tgz.
set -u
export PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-560}  # the whole job's seconds, inside the device call's (a shorter call passes its own)
JOB_OUT=${JOB_OUT:?}
mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
source gpu/tools/candidate_env.sh
work=$(mktemp -d /tmp/tree_checks.XXXXXX)
trap 'rm -rf "$work" "$cand"' EXIT  # with the unpacked candidate: as verify_all.sh's, left in /tmp each call
# The checks that failed, named in the last line and in the exit status, as verify_all.sh's (it was the last tar's 0
# whatever ran: a failed runtime verify, GPU test or sanitizer shard read as a pass).
failed=()
# (Bounded: a verify that hung took the job's whole limit, and the tests and sanitizers never ran.)
in_tree "$cand" "$cand_rev" timeout 60 python3 -m runtime verify 2>&1 | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("runtime verify")
in_tree "$cand" "$cand_rev" env SPARSE_DECODE_AOT_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  -m gpu tests/test_topk_gpu.py tests/test_indexer_gpu.py -rfEs > "$work/gpu_tests.log" 2>&1 || failed+=("GPU tests")
tail -5 "$work/gpu_tests.log"
tar czf "$JOB_OUT/tree_checks.tgz" -C "$work" .  # again at the end: a call cut short still brings the tests back
echo "=== sanitizers (${SECONDS}s)"
in_tree "$cand" "$cand_rev" env TOOL=all SECONDS_EACH=$((LIMIT - 20 - SECONDS)) JOB_OUT="$work" \
  bash gpu/jobs/topk_sanitize_full.sh | tee "$work/topk_sanitizers.txt"
# Each of the three tools with every shard clean, read from the verdict lines: the candidate's own
# topk_sanitize_full.sh runs here, and one older than the seventy-eighth session exited 0 whatever its tools found.
awk '/^verdict: /{n++; if ($2 != $4 || $4 < 1) bad++} END{exit !(n == 3 && !bad)}' "$work/topk_sanitizers.txt" \
  || failed+=("decode_topk sanitizers")
echo "=== tree_checks took ${SECONDS}s"
verdict="tree_checks: every check passed"; [ ${#failed[@]} -eq 0 ] || verdict="tree_checks: FAILED: ${failed[*]}"
echo "$verdict" | tee "$work/verdict.txt"
tar czf "$JOB_OUT/tree_checks.tgz" -C "$work" .
[ ${#failed[@]} -eq 0 ]
