#!/usr/bin/env bash
# limit: 560
# A candidate tree (CAND=NAME: .whl/NAME.tgz from gpu/tools/candidate_tree.sh; carry .whl) timed beside the checkout
# on one machine, the two trees alternating over two rounds: the FP32 64 x 1M cell probe (gpu/jobs/topk_cell_probe.py)
# and the decode_topk grid without its cluster sweep; then the indexer benchmark once each. Its checks (GPU tests,
# sanitizers) are gpu/jobs/tree_checks.sh. Everything comes back as $JOB_OUT/tree_ab.tgz (one record of it:
# gpu/tools/tree_ab_summary.py).
set -u
export PYTHONUNBUFFERED=1
JOB_OUT=${JOB_OUT:?}
mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
source gpu/tools/candidate_env.sh
work=$(mktemp -d /tmp/tree_ab.XXXXXX)
trap 'rm -rf "$work" "$cand"' EXIT  # with the unpacked candidate: as verify_all.sh's, left in /tmp each call
LIMIT=${LIMIT:-560}  # the whole job's seconds, inside the device call's 600
side_tree() { if [ "$1" = base ]; then echo "$base $base_rev"; else echo "$cand $cand_rev"; fi; }
# Packed after every step, so that a call cut short still brings back what ran.
pack() { tar czf "$JOB_OUT/tree_ab.tgz" -C "$work" .; }
# A step's timeout: its own, or what is left of LIMIT (less 15 s to pack); 0 skips it.
step_limit() { local left=$((LIMIT - 15 - SECONDS)); if [ "$left" -lt 20 ]; then echo 0; else echo $((left < $1 ? left : $1)); fi; }
run_step() {  # run_step SECONDS DIR LABEL CMD...: skipped, and said, where too little time is left
  local t; t=$(step_limit "$1"); shift
  if [ "$t" = 0 ]; then echo "skipped (${SECONDS}s of $LIMIT): ${*:3}"; return; fi
  in_tree "$1" "$2" timeout "$t" "${@:3}"
}
for round in 1 2; do
  for side in base cand; do
    read -r dir rev <<< "$(side_tree $side)"
    echo "=== round $round, $side (${SECONDS}s)"
    run_step 60 "$dir" "$rev" python3 gpu/jobs/topk_cell_probe.py "$work/probe_${side}_$round.json" | tail -3
    run_step 120 "$dir" "$rev" python3 benchmarks/bench_topk.py --out "$work/topk_${side}_$round.json" \
      --budget 90 --no-sweep | tail -2
    pack
  done
done
for side in base cand; do
  read -r dir rev <<< "$(side_tree $side)"
  echo "=== indexer, $side (${SECONDS}s)"
  run_step 60 "$dir" "$rev" python3 benchmarks/bench_indexer.py --out "$work/indexer_${side}.json" | tail -12
  pack
done
echo "=== tree_ab took ${SECONDS}s"
