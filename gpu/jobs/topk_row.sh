#!/usr/bin/env bash
# limit: 420
# decode_topk on the working tree's cache (the short-row kernels' rounds ran this), each part switchable:
#   decode_topk's GPU tests and sanitizers (gpu/tools/topk_checks.sh; SKIP_CHECKS=1: none);
#   topk_roots.py's case sets ROOTS_SETS (default "row"; the eleventh session's table rounds: "long" with
#     BENCH_TOPK=1, then a job of its own, topk_table.sh) on "." beside every carried .gl/head (the last commit's
#     cache) and .gl/cand* root;
#   with carried timeline builds (.gl/tl_*): their per-phase clocks (TOPK_TIMELINE_CASES=row for the row kernel;
#     gpu/jobs/topk_timeline.sh), and with .whl also on the indexer's DeepGEMM logits (topk_timeline_indexer.sh);
#   BENCH_TOPK=1: the benchmark;
#   with the DeepGEMM wheel carried (.whl): the indexer's GPU tests and benchmark (gpu/jobs/indexer.sh).
set -u
mkdir -p "${JOB_OUT:?}"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
export PYTHONPATH=${PYTHONPATH:-$PWD}
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh, which topk_checks.sh sources), the jobs it runs
# given what is left as their own: the checks (205 s) and the default set (200) left 15 s of its 420, before the
# timelines, the benchmark and the indexer job (110, with the wheel carried).
source gpu/tools/topk_checks.sh
[ -z "${SKIP_CHECKS:-}" ] && topk_checks
others=$(ls -d .gl/head .gl/cand* 2>/dev/null)
for set in ${ROOTS_SETS:-row}; do
  TOPK_ROOTS_CASES=$set run timeout "$(cap 200)" python3 gpu/jobs/topk_roots.py "$JOB_OUT/topk_roots_$set.json" . \
    $others 2>&1 | tail -5
done
if ls -d .gl/tl_* >/dev/null 2>&1; then
  LIMIT=$(cap 60) bash gpu/jobs/topk_timeline.sh
  if ls .whl/*.whl >/dev/null 2>&1; then
    for tl in .gl/tl_*; do TL_ROOT=$tl LIMIT=$(cap 120) bash gpu/jobs/topk_timeline_indexer.sh; done
  fi
fi
if [ -n "${BENCH_TOPK:-}" ]; then
  run timeout "$(cap 80)" python3 benchmarks/bench_topk.py --budget 70 --no-sweep --out "$JOB_OUT/bench_topk.json" \
    2>&1 | tail -8
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  ROUND_CAP=$(cap 150) bash gpu/jobs/indexer.sh 2>&1 | tail -40
fi
