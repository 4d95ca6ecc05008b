#!/usr/bin/env bash
# limit: 480
# Indexer flow (issue 5): which DeepGEMM scores here (probe: .whl/*.whl, else .whl/alt), warm its JIT
# cache for the serving shapes, GPU tests (DeepGEMM + AOT top-k vs reference, sharded vs replicated,
# a warm cache compiles nothing), then the benchmark (quick unless INDEXER_FULL=1).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:$SITE/nvidia/cuda_runtime/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
echo "nvcc: $(command -v nvcc) CUDA_HOME=${CUDA_HOME:-unset}"; nvcc --version 2>/dev/null | tail -1
timeout 180 python3 gpu/jobs/indexer_probe.py "$JOB_OUT/probe.json"; rc=$?
if [ $rc != 0 ] && ls .whl/alt/*.whl >/dev/null 2>&1; then
  echo "=== primary DeepGEMM failed (rc=$rc): trying .whl/alt"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_alt .whl/alt/*.whl
  PYTHONPATH=/tmp/site_alt:$PYTHONPATH timeout 120 python3 gpu/jobs/indexer_probe.py "$JOB_OUT/probe_alt.json" \
    && export PYTHONPATH=/tmp/site_alt:$PYTHONPATH
fi
echo "=== warm DeepGEMM's JIT cache (runtime.scoring.warm_deepgemm)"
timeout 150 python3 -c "
import json
from runtime.scoring import ServingShapes, warm_deepgemm
r = warm_deepgemm(ServingShapes(max_rows=64))
print(json.dumps(r)); json.dump(r, open('$JOB_OUT/warm.json', 'w'), indent=1)
"
echo "=== zero JIT: a fresh process's first decode steps against the steady state"
timeout 90 python3 gpu/jobs/indexer_probe.py --nojit "$JOB_OUT/no_jit.json"; echo "nojit rc=$?"
echo "=== GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_indexer_gpu.py -rs -s --maxfail=4 2>&1 | tail -40
echo "=== benchmark"
if [ "${INDEXER_FULL:-0}" = 1 ]; then q=; else q=--quick; fi
timeout 150 python3 benchmarks/bench_indexer.py $q --out "$JOB_OUT/bench_indexer.json"
echo "=== cache after: $(find $DG_JIT_CACHE_DIR -type f | wc -l) files"
