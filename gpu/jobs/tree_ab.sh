#!/usr/bin/env bash
# limit: 560
# A candidate tree (CAND=NAME: .whl/NAME.tgz from gpu/tools/candidate_tree.sh; carry .whl) timed beside the checkout
# on one machine, the two trees alternating over two rounds: the FP32 64 x 1M cell probe (gpu/jobs/topk_cell_probe.py)
# and the decode_topk grid without its cluster sweep; then the indexer benchmark once each. Its checks (GPU tests,
# sanitizers) are gpu/jobs/tree_checks.sh. Everything comes back as $JOB_OUT/tree_ab.tgz.
set -u
export PYTHONUNBUFFERED=1
JOB_OUT=${JOB_OUT:?}
source gpu/tools/candidate_env.sh
work=$(mktemp -d /tmp/tree_ab.XXXXXX)
side_tree() { if [ "$1" = base ]; then echo "$base $base_rev"; else echo "$cand $cand_rev"; fi; }
for round in 1 2; do
  for side in base cand; do
    read -r dir rev <<< "$(side_tree $side)"
    echo "=== round $round, $side (${SECONDS}s)"
    in_tree "$dir" "$rev" timeout 60 python3 gpu/jobs/topk_cell_probe.py "$work/probe_${side}_$round.json" | tail -3
    in_tree "$dir" "$rev" timeout 120 python3 benchmarks/bench_topk.py --out "$work/topk_${side}_$round.json" \
      --budget 90 --no-sweep | tail -2
  done
done
for side in base cand; do
  read -r dir rev <<< "$(side_tree $side)"
  echo "=== indexer, $side (${SECONDS}s)"
  in_tree "$dir" "$rev" timeout 60 python3 benchmarks/bench_indexer.py --out "$work/indexer_${side}.json" | tail -12
done
echo "=== tree_ab took ${SECONDS}s"
tar czf "$JOB_OUT/tree_ab.tgz" -C "$work" .
