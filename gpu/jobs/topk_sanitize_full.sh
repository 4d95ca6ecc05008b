#!/usr/bin/env bash
# limit: 420
# decode_topk under one compute-sanitizer tool (TOOL: racecheck by default; all: the three) in full mode (every
# cluster size, the twins, the short-row kernel; randn, equal and tied rows), as SHARDS interleaved processes side
# by side (racecheck in one process took over 230 s on the H200). Reports: $JOB_OUT/topk_<tool>_<shard>.txt.
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
if [ "${TOOL:-}" = all ]; then
  # The three tools side by side (racecheck in SHARDS processes, default 8; memcheck and synccheck in three each), as
  # verify_all.sh and tree_checks.sh run them; each tool's summary in $JOB_OUT/topk_<tool>_summary.txt, then printed.
  pids=()
  for t in memcheck synccheck racecheck; do
    # (three: the crowded cases, first in the list, spread over them; the 4-CTA twin's two on two shards)
    shards=3; [ $t = racecheck ] && shards=${SHARDS:-8}
    ONLY_SHARDS= CROWDED= TOOL=$t SHARDS=$shards bash "$0" > "$JOB_OUT/topk_${t}_summary.txt" 2>&1 &
    pids+=($!)
  done
  bad=0  # the tools not clean: each run's exit status is its verdict (every shard clean)
  for pid in "${pids[@]}"; do wait "$pid" || bad=$((bad + 1)); done
  for t in memcheck synccheck racecheck; do
    echo "-- topk $t (full mode)"; cat "$JOB_OUT/topk_${t}_summary.txt"
  done
  exit "$bad"  # (it was 0 whatever the tools found: run_all.sh's summary said rc=0; verify_all.sh takes it as
  # decode_topk's verdict)
fi
tool=${TOOL:-racecheck}
n=${SHARDS:-8}
# ONLY_SHARDS="0 3": those of racecheck's n shards alone (memcheck and synccheck run all of theirs), e.g. to finish
# the ones an earlier run left incomplete.
shards=${ONLY_SHARDS:-$(seq 0 $((n - 1)))}; [ "$tool" != racecheck ] && shards=$(seq 0 $((n - 1)))
extra=; [ "$tool" = racecheck ] && extra="--racecheck-report all"
# Memcheck sees each tensor as its own allocation (gpu/tools/mla_sanitize.sh says why); the other tools keep torch's
# caching allocator (what they check does not depend on it, and their runs are long already).
nocache=; [ "$tool" = memcheck ] && nocache=PYTORCH_NO_CUDA_MEMORY_CACHING=1
# The crowded-warp cases take minutes a case under the tools (gpu/jobs/topk_sanitize.py says why): racecheck leaves
# them to gpu/jobs/topk_racecheck_crowded.sh unless CROWDED (with, skip, only) says otherwise.
crowded=${CROWDED:-with}; [ "$tool" = racecheck ] && crowded=${CROWDED:-skip}
# Each shard's timeout: SECONDS_EACH (default 400), within a LIMIT that run_all.sh cut (less 20 s for the verdict): the
# shards ran their 400 s past a shorter cut, which killed the job before its verdict.
each=${SECONDS_EACH:-400}
if [ -n "${LIMIT:-}" ] && [ $((LIMIT - 20)) -lt "$each" ]; then each=$((LIMIT - 20)); fi
[ "$each" -lt 1 ] && each=1
echo "$tool: each shard's timeout ${each}s"
for i in $shards; do
  # (COMPUTE_SANITIZER: another binary, e.g. tests/test_gpu_job_verdicts.py's fake one on a CPU)
  ( env $nocache timeout "$each" "${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}" \
      --tool "$tool" $extra --report-api-errors no --error-exitcode 3 --print-limit 4 \
      python3 gpu/jobs/topk_sanitize.py --shard=$i/$n --crowded=$crowded \
      > "$JOB_OUT/topk_${tool}_$i.txt" 2>&1; echo "rc=$?" >> "$JOB_OUT/topk_${tool}_$i.txt" ) &
done
wait
# The verdict reads the summaries, the cases' count and rc as far as it can (report_clean), and any mismatch.
source gpu/tools/sanitizer_verdict.sh
clean=0
for i in $shards; do
  f="$JOB_OUT/topk_${tool}_$i.txt"
  echo "-- $tool shard $i/$n"; grep -E "cases match|SUMMARY|rc=|MISMATCH" "$f"
  if report_clean "$f" "$tool" "cases match" && ! grep -q MISMATCH "$f"; then
    clean=$((clean + 1))
  elif ! grep -qE "cases match" "$f"; then  # cut short (its timeout): what it ran, and any error it printed so far
    errors=$(grep -E '^=========' "$f" | grep -viE 'summary|warning' | grep -ciE 'error|invalid')
    echo "   incomplete: $(grep -c '^case ok' "$f") cases ran, $errors sanitizer error lines so far"
  fi
done
echo "verdict: $clean of $(wc -w <<< "$shards") shards clean (of $n; 0 sanitizer errors, every case matching;" \
  "crowded cases: $crowded)"
echo "took ${SECONDS}s"
[ "$clean" -gt 0 ] && [ "$clean" -eq "$(wc -w <<< "$shards")" ]  # the exit status too (it was the echo's 0)
