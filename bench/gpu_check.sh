#!/usr/bin/env bash
# The GPU checks of the CUDA platform, as one prepared run for a machine with an NVIDIA GPU and
# its own torch / triton / transformers (no venv, nothing fetched). See docs/cuda.md.
#
#   bash bench/gpu_check.sh tests   # Triton kernels, sampling kernel, decode graphs, bf16 vs HF (~3 min)
#   bash bench/gpu_check.sh bench   # bench/gpu_throughput.py, the nano-vllm workload (< 8 min)
#   bash bench/gpu_check.sh all     # both
#
# host is installed with --no-deps into a scratch target (its entry points must be real
# dist-info for the plugins to be found); the offline engine, the kernels and these tests need
# nothing beyond torch, triton, transformers, numpy, safetensors and pluggy. Wheels for anything
# else can be put in .whl/ and are installed first. Logs and JSON go to $OUT (default
# /tmp/host-gpu-check); copy the JSON into bench/results/ with the figures in your note.
set -uo pipefail
stage="${1:-all}"
OUT="${OUT:-/tmp/host-gpu-check}"
SITE="${HOST_GPU_SITE:-/tmp/host-gpu-site}"
mkdir -p "$OUT" "$SITE"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
fi
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target "$SITE" . \
  >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"

rc=0
if [[ "$stage" == tests || "$stage" == all ]]; then
  # pytest runs with --import-mode=importlib: `host` comes from $SITE (the installed dist with its entry points)
  timeout "${HOST_GPU_TEST_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider -x \
    tests/plugins/triton_ops/test_kernels.py tests/plugins/triton_ops/test_sampling.py \
    tests/core/worker/test_graph_runner.py tests/plugins/builtin_cuda/test_gpu_bf16.py \
    2>&1 | tee "$OUT/tests.log"
  rc=$(( rc | ${PIPESTATUS[0]} ))
fi
if [[ "$stage" == bench || "$stage" == all ]]; then
  timeout "${HOST_GPU_BENCH_TIMEOUT:-480}" "$PY" bench/gpu_throughput.py --ablation 64 --out "$OUT/gpu_throughput-$(date +%Y%m%d).json" \
    2>&1 | tee "$OUT/bench.log"
  rc=$(( rc | ${PIPESTATUS[0]} ))
fi
exit "$rc"
