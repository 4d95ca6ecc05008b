#!/usr/bin/env bash
# limit: 120
# decode_topk per-phase clocks (timeline build carried in .gl/tl) on the indexer benchmark's shapes: its
# DeepGEMM logits beside random ones (gpu/jobs/topk_timeline.py, TOPK_TIMELINE_INPUT=indexer).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:$SITE/nvidia/cuda_runtime/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
[ -f .whl/dg_jit_cache.tgz ] && tar xzf .whl/dg_jit_cache.tgz -C /tmp
TOPK_TIMELINE_INPUT=indexer timeout 100 python3 gpu/jobs/topk_timeline.py .gl/tl "$JOB_OUT/timeline_indexer.json"
