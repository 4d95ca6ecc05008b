#!/usr/bin/env bash
# limit: 560
# The forty-first session's third device call, as it ran (carry .whl and .gl): the gather microbenchmark's L2-hint
# routes, the sparse-MLA A/B of a candidate cache in .gl/mlacand1 against the committed one, and the cold-logits job.
# The candidate was built from gpu/candidates/mla_l2_prefetch_s41.diff applied to the tree: copy cubins/ and
# manifests/ into .gl/mlacand1, then SPARSE_MLA_EXPERIMENT=l2_256 python build_kernels.py --only sparse_mla_decode
# --arch sm_90a --out .gl/mlacand1. A call brings back at most 8 files: this job writes more (tar them to keep all).
# (The limit: the A/B's 330 s and the cold logits' 150 s after the microbenchmark; without the line run_all.sh gave
# the job its default 120 s.)
set -u
# The carried timeline builds record their measurement switches, which the runtime refuses unless asked.
export SPARSE_DECODE_AOT_ALLOW_MEASUREMENT_BUILD=1
export PYTHONPATH=$PWD
mkdir -p $OUT
echo "=== gather micro"
(nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/gather_route gpu/micro/gather_route.cu -lcuda && for r in 1 2; do GATHER_GRIDS="5 60" GATHER_ROUTES="0 13 14 5 15 9" /tmp/gather_route; done) > $OUT/gather_l2hint_s41.jsonl 2>&1
cat $OUT/gather_l2hint_s41.jsonl | cut -c1-160
echo "=== MLA A/B (candidate .gl/mlacand1: KV cp.async with .L2::256B)"
BENCH_OUT=$OUT ROUNDS=3 timeout 330 bash gpu/jobs/mla_bench_ab.sh 2>&1 | tail -30
echo "=== cold logits"
source gpu/tools/deepgemm_env.sh >/dev/null
timeout 150 python3 gpu/jobs/indexer_cold_logits.py --out $OUT/indexer_cold_logits_s41.json 2>&1 | grep -v "^WARNING" | tail -10
echo "took ${SECONDS}s"
