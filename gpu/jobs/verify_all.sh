#!/usr/bin/env bash
# limit: 575
# One whole verification pass on the committed tree (carry .whl): every GPU test (DeepGEMM installed from the
# carried wheel), then the sanitizers of the kernel families (sparse MLA's small launches with the edge inputs;
# decode_topk's full mode: every cluster size, the twins and the short-row kernel; its racecheck in shards;
# topk_pool_rows' GPU tests under memcheck), then the indexer
# job (tests, benchmark, zero-JIT probes, memcheck of one step). Reports in $JOB_OUT/verify_all.tgz (JOB_OUT=$OUT
# is enough: it holds that one file). The last line (verdict.txt in the archive) names the phases that failed, if any,
# and the exit status is 1 then.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
# The whole job's seconds, inside the device call's 600. Its phases end by their bounds: the GPU tests by their own
# (30 + 260 s), the sanitizers by LIMIT - 115 (given at least 30 s), the indexer job by LIMIT - 5, the last pack after
# it. (The limit said 560 while the indexer job was given LIMIT + 15 - SECONDS: up to 575 s in all, past the line that
# run_all.sh runs a job under.)
LIMIT=${LIMIT:-575}
archive_dir=${JOB_OUT:?}
mkdir -p "$archive_dir"  # JOB_OUT=$OUT/<job>, a folder not made yet: every pack failed and nothing came back
# The reports gather in a folder of their own and go back as one archive (a call brings back at most 8 files, two
# folders deep), packed again after every phase: a call cut short still brings back the phases that ran.
work=$(mktemp -d /tmp/verify_all.XXXXXX)
trap 'rm -rf "$work"' EXIT  # the archive holds it all: the folder was left in /tmp, one more each call
export JOB_OUT=$work
pack() { tar czf "$archive_dir/verify_all.tgz" -C "$work" .; }
# The phases that failed, named in the last line and in the exit status (which was the last pack's 0 whatever ran).
failed=()
echo "=== 1. all GPU tests"
bash gpu/jobs/all_gpu_tests.sh 2>&1 | tee "$work/all_gpu_tests.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("GPU tests")
pack
echo "=== 2. sanitizers (sparse MLA 3 tools + decode_topk full mode: memcheck, synccheck in 3 shards, racecheck in 8 without the crowded cases; topk_pool_rows memcheck; in parallel)"
# decode_topk's three tools side by side with the sparse-MLA ones (racecheck in eight shards; in six, 223-271 s on the
# H200), each bounded so that the indexer job keeps 110 s, its own limit (77-81 s in the fifty-third and fifty-fifth
# sessions), and the last pack its 5
each=$((LIMIT - 115 - SECONDS)); [ "$each" -gt 320 ] && each=320; [ "$each" -lt 30 ] && each=30
TOOL=all SECONDS_EACH=$each bash gpu/jobs/topk_sanitize_full.sh > "$work/topk_sanitizers.txt" 2>&1 &
topk=$!
# topk_pool_rows' GPU tests under memcheck beside them (13 s alone on an H100; 108 s beside the others, each tensor
# its own allocation, in the seventy-seventh session, when 120 s cut its summary off): as long as they may take
bash gpu/tools/pool_rows_memcheck.sh "$each" > "$work/pool_rows_memcheck.txt" 2>&1 &
pool_rows=$!
bash gpu/tools/mla_sanitize.sh $((each < 200 ? each : 200)) | tee "$work/mla_sanitizers.txt"
wait "$pool_rows" || failed+=("topk_pool_rows memcheck")
wait "$topk" || failed+=("decode_topk sanitizers")  # its exit status: each of the three tools with every shard clean
cat "$work/topk_sanitizers.txt"
tail -3 "$work/pool_rows_memcheck.txt"
# Sparse MLA's verdict, 3 of 3 (the tools' rc cannot say: racecheck exits 3 on its warnings).
grep -qx "verdict: 3 of 3 tools clean.*" "$work/mla_sanitizers.txt" || failed+=("sparse MLA sanitizers")
pack
echo "=== 3. indexer job (took ${SECONDS}s so far)"
mkdir -p "$work/indexer"
left=$((LIMIT - 5 - SECONDS))
if [ "$left" -lt 60 ]; then
  echo "skipped: ${left}s left of the job's limit"; failed+=("indexer (skipped)")
else
  ROUND_CAP=$left JOB_OUT="$work/indexer" bash gpu/jobs/indexer.sh 2>&1 | tee "$work/indexer/indexer.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("indexer")
fi
echo "=== verify_all took ${SECONDS}s"
verdict="verify_all: every phase passed"; [ ${#failed[@]} -eq 0 ] || verdict="verify_all: FAILED: ${failed[*]}"
echo "$verdict" | tee "$work/verdict.txt"
pack
[ ${#failed[@]} -eq 0 ]
