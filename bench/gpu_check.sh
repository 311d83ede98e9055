#!/usr/bin/env bash
# The GPU checks of the CUDA platform, as one prepared run for a machine with an NVIDIA GPU and
# its own torch / triton / transformers (no venv, nothing fetched). See docs/cuda.md.
#
#   bash bench/gpu_check.sh tests   # Triton kernels, sampling kernel, decode graphs, bf16 vs HF (~3 min)
#   bash bench/gpu_check.sh bench   # bench/gpu_throughput.py, the nano-vllm workload (< 8 min)
#   bash bench/gpu_check.sh all     # both
#   bash bench/gpu_check.sh quant   # quantized linears: kernel tests, error and speed vs torch, a GEMV tile sweep, decode tok/s (~6 min)
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
if [[ "$stage" == quant ]]; then
  # the Triton kernels of plugins/triton_ops/quant_linear.py on the GPU. The tests need the pure-Python
  # `gguf` package (the ground truth): put its wheel in .whl/ (pip download --no-deps gguf==0.19.0 -d .whl),
  # else they skip. Then, for each format on a 4096x4096 weight in bfloat16: max error against the torch
  # reference (dequantize + matmul in float64), microseconds per call, weight GB/s at M=1 and tok/s
  # (M / call time) next to a dense bfloat16 F.linear; a sweep of GEMV tile sizes at M=1 (the module's
  # GEMV_* constants, to tune them); then decode tok/s of a Qwen3-0.6B-shaped model (dummy weights)
  # unquantized and with online int8 / fp8 weights.
  timeout "${HOST_GPU_TEST_TIMEOUT:-300}" "$PY" -m pytest -q -p no:cacheprovider -x -rs \
    tests/plugins/triton_ops/test_quant_linear.py 2>&1 | tee "$OUT/quant_tests.log"
  rc=$(( rc | ${PIPESTATUS[0]} ))
  timeout "${HOST_GPU_BENCH_TIMEOUT:-480}" "$PY" - "$OUT/quant_linear_gpu-$(date +%Y%m%d).json" <<'PYEOF' 2>&1 | tee "$OUT/quant_bench.log"
import json, os, sys, time
import torch
import torch.nn.functional as F
from host.plugins.triton_ops import quant_linear as ql
from host.plugins.quantization.gguf_blocks import dequantize_rows

# a dry run on CPU: HOST_QUANT_NK=256 TRITON_INTERPRET=1 (no GPU: plain timers, no decode section)
dev = "cuda" if torch.cuda.is_available() else "cpu"
N = K = int(os.environ.get("HOST_QUANT_NK", "4096"))
if dev == "cuda":
    from triton.testing import do_bench
else:
    def do_bench(fn):
        fn(); t0 = time.perf_counter(); fn()
        return (time.perf_counter() - t0) * 1e3
gen = torch.Generator(device=dev).manual_seed(0)
results = {"gpu": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (interpreter)", "N": N, "K": K, "kernels": [], "decode": []}
if dev == "cuda":
    results["capability"] = list(torch.cuda.get_device_capability())

def gguf_weight(qtype):
    size, nbytes = ql.GGUF_BLOCKS[qtype]
    b = torch.randint(0, 256, (N, K // size, nbytes), dtype=torch.uint8, device=dev, generator=gen)
    for off in {ql.Q4_0: (0,), ql.Q4_1: (0, 2), ql.Q8_0: (0,), ql.Q4_K: (0, 2), ql.Q6_K: (208,)}[qtype]:
        d = (torch.rand(N, K // size, device=dev, generator=gen) * 2e-3 + 1e-4).half()
        b[:, :, off:off + 2] = d.view(torch.uint8).reshape(N, K // size, 2)
    return b.reshape(N, -1)

cases = {}
for qt in ql.GGUF_BLOCKS:
    qw = gguf_weight(qt)
    cases[ql.GGUF_NAMES[qt]] = (lambda x, qw=qw, qt=qt: ql.gguf_linear(x, qw, qt, None), dequantize_rows(qw, qt, torch.float64), qw.numel())
q8 = torch.randint(-128, 128, (N, K), dtype=torch.int8, device=dev, generator=gen)
s8 = torch.rand(N, device=dev, generator=gen) * 1e-2
cases["int8"] = (lambda x: ql.int8_linear(x, q8, s8, None), q8.double() * s8.double()[:, None], q8.numel())
w = torch.randn(N, K, device=dev, generator=gen)
sf = w.abs().amax(1) / 448
qf = (w / sf[:, None]).to(torch.float8_e4m3fn)
for name, fn in (("fp8", ql.fp8_linear), ("fp8_triton", ql.fp8_linear_triton)):
    cases[name] = (lambda x, fn=fn: fn(x, qf, sf, None), qf.double() * sf.double()[:, None], qf.numel())
dense = torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=gen)
for m in (1, 16, 256):
    x = torch.randn(m, K, device=dev, generator=gen).to(torch.bfloat16)
    t_dense = do_bench(lambda: F.linear(x, dense)) * 1e-3
    print(f"M={m:4d} dense bf16 F.linear {t_dense * 1e6:9.1f} us  {m / t_dense:12.0f} tok/s")
    for name, (fn, w64, nbytes) in cases.items():
        if name.startswith("fp8"):  # against the product of the quantized activations
            xq, sx = ql.quantize_per_token_reference(x)
            ref = (xq.double() * sx.double()) @ w64.T
        else:
            ref = x.double() @ w64.T
        y = fn(x)
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        t = do_bench(lambda: fn(x)) * 1e-3
        row = dict(kernel=name, M=m, max_rel_err=err, us=t * 1e6, tok_per_s=m / t, weight_GBps=nbytes / t / 1e9, vs_dense=t_dense / t)
        results["kernels"].append(row)
        print(f"M={m:4d} {name:10s} max rel err {err:.2e}  {t * 1e6:9.1f} us  {m / t:12.0f} tok/s  {nbytes / t / 1e9:7.0f} GB/s weights  x{t_dense / t:.2f} of dense")

# GEMV tuning sweep (M = 1): rows per program, K per step, programs per SM, warps
results["gemv_sweep"] = []
x1 = torch.randn(1, K, device=dev, generator=gen).to(torch.bfloat16)
default = (ql.GEMV_BLOCK_N, ql.GEMV_BLOCK_K, ql.GEMV_PROGRAMS_PER_SM, ql.GEMV_NUM_WARPS)
for cfg in [default, (16, 128, 8, 4), (32, 128, 4, 4), (8, 256, 4, 4), (16, 256, 4, 8), (64, 64, 4, 4), (4, 256, 8, 2)]:
    ql.GEMV_BLOCK_N, ql.GEMV_BLOCK_K, ql.GEMV_PROGRAMS_PER_SM, ql.GEMV_NUM_WARPS = cfg
    for name in ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "int8"):
        fn, w64, nbytes = cases[name]
        ref = x1.double() @ w64.T
        err = ((fn(x1).double() - ref).abs().max() / ref.abs().max()).item()
        t = do_bench(lambda: fn(x1)) * 1e-3
        results["gemv_sweep"].append(dict(cfg=list(cfg), kernel=name, us=t * 1e6, weight_GBps=nbytes / t / 1e9, max_rel_err=err))
        print(f"GEMV block_n={cfg[0]:3d} block_k={cfg[1]:3d} per_sm={cfg[2]} warps={cfg[3]} {name:5s} {t * 1e6:8.1f} us {nbytes / t / 1e9:6.0f} GB/s err {err:.1e}")
ql.GEMV_BLOCK_N, ql.GEMV_BLOCK_K, ql.GEMV_PROGRAMS_PER_SM, ql.GEMV_NUM_WARPS = default

try:  # end to end: decode tok/s, Qwen3-0.6B shape with dummy weights, online-quantized linears
    import tempfile, transformers
    if dev != "cuda":
        raise RuntimeError("skipped without a GPU")
    from host import LLM, SamplingParams
    path = tempfile.mkdtemp(prefix="host-quant-")
    transformers.Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=4096,
                             tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"]).save_pretrained(path)
    for quant in ("none", "int8", "fp8"):
        try:
            llm = LLM(path, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=1024, quantization=quant)
            for batch in (1, 32):
                prompts = [{"prompt_token_ids": [100 + i] * 32} for i in range(batch)]
                llm.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True))
                torch.cuda.synchronize(); t0 = time.perf_counter()
                outs = llm.generate(prompts, SamplingParams(max_tokens=128, ignore_eos=True))
                torch.cuda.synchronize(); dt = time.perf_counter() - t0
                toks = sum(len(o.outputs[0].token_ids) for o in outs)
                results["decode"].append(dict(quantization=quant, batch=batch, tok_per_s=toks / dt))
                print(f"decode quantization={quant:5s} batch={batch:3d} {toks / dt:9.0f} tok/s")
            del llm
            torch.cuda.empty_cache()
        except Exception as exc:  # report and go on: the kernels' figures above still count
            print(f"decode quantization={quant}: FAILED {type(exc).__name__}: {exc}")
except Exception as exc:
    print(f"decode section FAILED {type(exc).__name__}: {exc}")
json.dump(results, open(sys.argv[1], "w"), indent=1)
bad = [r for r in results["kernels"] + results["gemv_sweep"] if not r["max_rel_err"] <= 1e-2]  # bf16 output rounding is 4e-3
print("max error within bounds" if not bad else f"ERRORS TOO LARGE: {bad}")
sys.exit(1 if bad else 0)
PYEOF
  rc=$(( rc | ${PIPESTATUS[0]} ))
fi
exit "$rc"
