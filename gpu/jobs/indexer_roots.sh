#!/usr/bin/env bash
# limit: 90
# decode_topk cache roots (. and carried .gl/*) side by side on the indexer benchmark's DeepGEMM logits.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD}
SITE=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:$SITE/nvidia/cuda_runtime/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=/tmp/dg_jit_cache
[ -f .whl/dg_jit_cache.tgz ] && tar xzf .whl/dg_jit_cache.tgz -C /tmp
timeout 80 python3 gpu/jobs/indexer_roots.py "$JOB_OUT/indexer_roots.json" . $(ls -d .gl/* 2>/dev/null)
