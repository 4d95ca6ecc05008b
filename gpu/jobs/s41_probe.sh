set -u
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
