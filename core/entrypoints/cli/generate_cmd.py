"""``host generate`` and ``host chat``: the offline engine from the terminal."""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

ModelOpt = typer.Option(None, "--model", "-m", help="HF model directory or .gguf file (default: SmolLM2-135M-Instruct).")
# engine flags shared by `host generate` and `host serve`
DtypeOpt = typer.Option(None, "--dtype", help="auto, float32, bfloat16 or float16.")
MaxModelLenOpt = typer.Option(None, "--max-model-len")
MaxNumSeqsOpt = typer.Option(None, "--max-num-seqs")
MaxNumBatchedTokensOpt = typer.Option(None, "--max-num-batched-tokens")
KvCacheMemoryOpt = typer.Option(None, "--kv-cache-memory", help="KV cache budget, e.g. 1GiB.")
GpuMemoryUtilizationOpt = typer.Option(None, "--gpu-memory-utilization")
PrefixCachingOpt = typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching")
LoadFormatOpt = typer.Option(None, "--load-format", help="auto, safetensors, gguf or dummy.")
OptLevelOpt = typer.Option(None, "-O", "--optimization-level", help="0 (eager) to 3; default 2. See docs/cuda.md.")
EnforceEagerOpt = typer.Option(False, "--enforce-eager", help="No device graphs and no torch.compile, whatever the -O level.")
CustomOpsOpt = typer.Option(None, "--custom-ops/--no-custom-ops", help="The platform's fused kernels (default: on from -O1).")
TorchCompileOpt = typer.Option(None, "--torch-compile/--no-torch-compile", help="torch.compile the model (default: on at -O3).")
AsyncSchedulingOpt = typer.Option(None, "--async-scheduling/--no-async-scheduling", help="Plan each step while the previous one runs (default: on for GPUs).")
CudaGraphSizesOpt = typer.Option(None, "--cuda-graph-sizes", help="Decode batch sizes to capture as graphs, e.g. 1,2,4,8; 'none' turns graphs off (default: on from -O2 where the platform can capture).")


def engine_flag_kwargs(**flags: Any) -> dict[str, Any]:
    """The engine flags ``host generate`` and ``host serve`` share, as ``EngineArgs`` keyword
    arguments: only those given (``None`` / an unset ``--enforce-eager`` are left out), with
    ``--kv-cache-memory`` and ``--cuda-graph-sizes`` parsed."""
    kw = {k: v for k, v in flags.items() if v is not None and k not in ("kv_cache_memory", "cuda_graph_sizes")}
    if not kw.get("enforce_eager", True):
        del kw["enforce_eager"]
    if flags.get("kv_cache_memory") is not None:
        kw["kv_cache_memory"] = _parse_bytes(flags["kv_cache_memory"])
    cuda_graph_sizes = flags.get("cuda_graph_sizes")
    if cuda_graph_sizes is not None:
        text = cuda_graph_sizes.strip().lower()
        if text in ("", "none", "off", "0"):
            kw["cuda_graphs"] = False
        else:
            try:
                kw["cuda_graph_sizes"] = [int(x) for x in text.replace(" ", ",").split(",") if x]
            except ValueError:
                raise typer.BadParameter(
                    f"{cuda_graph_sizes!r} is not a list of batch sizes; use e.g. 1,2,4,8 or none", param_hint="--cuda-graph-sizes"
                ) from None
    return kw


def _parse_bytes(value: str | None) -> int | None:
    """``--kv-cache-memory 2GiB`` / ``512MiB`` / a plain byte count."""
    if value is None:
        return None
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    text = value.strip().lower()
    for suffix, mult in units.items():
        if text.endswith(suffix):
            number = text[: -len(suffix)].strip()
            break
    else:
        number, mult = text, 1
    try:
        return int(float(number) * mult)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a size; use e.g. 2GiB, 512MiB or a byte count", param_hint="--kv-cache-memory") from None


def generate_cmd(
    prompt: list[str] = typer.Argument(..., help="One or more prompts."),
    model: Optional[str] = ModelOpt,
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to generate per prompt."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 means greedy."),
    dtype: Optional[str] = DtypeOpt,
    max_model_len: Optional[int] = MaxModelLenOpt,
    max_num_seqs: Optional[int] = MaxNumSeqsOpt,
    max_num_batched_tokens: Optional[int] = MaxNumBatchedTokensOpt,
    kv_cache_memory: Optional[str] = KvCacheMemoryOpt,
    gpu_memory_utilization: Optional[float] = GpuMemoryUtilizationOpt,
    enable_prefix_caching: Optional[bool] = PrefixCachingOpt,
    load_format: Optional[str] = LoadFormatOpt,
    optimization_level: Optional[int] = OptLevelOpt,
    enforce_eager: bool = EnforceEagerOpt,
    custom_ops: Optional[bool] = CustomOpsOpt,
    torch_compile: Optional[bool] = TorchCompileOpt,
    cuda_graph_sizes: Optional[str] = CudaGraphSizesOpt,
    async_scheduling: Optional[bool] = AsyncSchedulingOpt,
    plugins: Optional[str] = typer.Option(None, "--plugins"),
) -> None:
    """Complete each PROMPT with the model and print the results."""
    from host import LLM, SamplingParams

    try:
        llm = LLM(model, plugins=plugins, **engine_flag_kwargs(
            dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, kv_cache_memory=kv_cache_memory,
            gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
            load_format=load_format, async_scheduling=async_scheduling, optimization_level=optimization_level,
            enforce_eager=enforce_eager, custom_ops=custom_ops, torch_compile=torch_compile, cuda_graph_sizes=cuda_graph_sizes,
        ))
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        outputs = llm.generate(list(prompt), params)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    for out in outputs:
        if len(outputs) > 1:
            typer.echo(f"--- {out.prompt!r}")
        typer.echo(out.prompt + out.outputs[0].text if out.prompt else out.outputs[0].text)


def chat_cmd(
    model: Optional[str] = ModelOpt,
    max_tokens: int = typer.Option(256, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    plugins: Optional[str] = typer.Option(None, "--plugins"),
) -> None:
    """Chat with the model in the terminal; tokens are printed as they are generated.
    An empty line or Ctrl-D ends the session."""
    from host import LLM, SamplingParams
    from host.core.frontend.chat_stream import stream_chat

    llm = LLM(model, plugins=plugins)
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            typer.echo("you> ", nl=False)
        line = sys.stdin.readline()
        if not line or not line.strip():
            break
        messages.append({"role": "user", "content": line.strip()})
        if interactive:
            typer.echo("assistant> ", nl=False)
        reply = ""
        for piece in stream_chat(llm, messages, params):
            reply += piece
            typer.echo(piece, nl=False)
            sys.stdout.flush()
        typer.echo("")
        messages.append({"role": "assistant", "content": reply})
