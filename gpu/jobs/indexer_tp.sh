#!/usr/bin/env bash
# limit: 120
# Row-sharded indexer over NCCL (issue 6): torchrun one process per GPU at world 2 and 4 where the
# machine has them; gathered buffers must equal a replicated run on every rank; timings as JSON.
# On a machine of one GPU it only says so (0 s of work): the lead decides on which kind it runs.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
n=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$n" -lt 2 ]; then echo "indexer_tp: $n GPU(s) here, needs 2 or more: not run"; exit 0; fi
mkdir -p "$JOB_OUT"  # JOB_OUT=$OUT/<job> names a folder not made yet: the first write into it failed
# Each step cut to what is left of the limit (gpu/tools/job_limit.sh): the warm-up's 40 s, the two worlds' 60 each and
# the two memchecks' 30 came to 220 s against the job's 120.
source gpu/tools/job_limit.sh
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
[ -f .whl/dg_jit_cache.tgz ] && tar xzf .whl/dg_jit_cache.tgz -C /tmp
timeout "$(cap 40)" python3 -c \
  "from runtime.scoring import ServingShapes, warm_deepgemm; print(warm_deepgemm(ServingShapes(max_rows=64)))"
for w in 2 4; do
  [ "$n" -ge $w ] || continue
  timeout "$(cap 60)" torchrun --standalone --nproc-per-node $w benchmarks/bench_indexer_tp.py \
    --out "$JOB_OUT/indexer_tp_w$w.json"
  echo "world $w rc=$?"
done
# Diagnostic (R3's memcheck of one small step counted 86 errors, as many as the topk job's): are they
# CUDA API errors (e.g. in the loader's validation) or device faults? Device faults only, then the first errors.
if command -v compute-sanitizer >/dev/null; then
  SAN="compute-sanitizer --tool memcheck --error-exitcode 3"
  timeout "$(cap 30)" $SAN --report-api-errors no python3 gpu/jobs/indexer_probe.py --step 2>&1 \
    | grep -v "Host Frame" | tail -4
  timeout "$(cap 30)" $SAN --print-limit 3 python3 gpu/jobs/indexer_probe.py --step 2>&1 \
    | grep -v "Host Frame" | head -20
fi
