#!/usr/bin/env bash
# limit: 200
# Lead's last sanitizer pass for what R3 left open: memcheck (device faults only) of one indexer
# decode step (DeepGEMM logits + AOT top-k), and a decode_topk racecheck given time to finish.
set -u
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:$SITE/nvidia/cuda_runtime/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
[ -f .whl/dg_jit_cache.tgz ] && tar xzf .whl/dg_jit_cache.tgz -C /tmp
S=/usr/local/cuda/bin/compute-sanitizer
echo "=== indexer step, memcheck (device faults only)"
timeout 70 $S --tool memcheck --report-api-errors no --print-limit 10 python3 gpu/jobs/indexer_probe.py --step 2>&1 | tail -6
echo "=== decode_topk, racecheck"
timeout 110 $S --tool racecheck --racecheck-report all --print-limit 10 python3 gpu/jobs/topk_sanitize.py --quick 2>&1 | tail -14
