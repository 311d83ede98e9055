"""bench/cpu_peers.py's pure helpers: the linear-FLOPs count behind its physical bound (checked
against the linear layers of a transformers Llama built from the same config), the bound itself,
the cross-engine token check and the table. The peers themselves are never installed or run here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def cpu_peers():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("cpu_peers_under_test", BENCH / "cpu_peers.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("head_dim,kv_heads,tied", [(None, 2, True), (24, 1, False)])
def test_linear_flops_match_the_linears_of_a_transformers_llama(cpu_peers, head_dim, kv_heads, tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=300, tie_word_embeddings=tied)
    model = LlamaForCausalLM(config)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    as_dict = config.to_dict()
    if head_dim is None:
        as_dict.pop("head_dim", None)  # the hidden size over the heads, as an older config.json leaves it
    assert cpu_peers.linear_flops_per_token(as_dict) == 2 * weights


def test_physical_bound_is_the_lower_of_compute_and_memory(cpu_peers):
    # 1 GFLOP/token at 100 GFLOP/s: 100 tok/s; 100 MB of weights at 10 GB/s: 100 steps/s
    one = cpu_peers.physical_bound(10**9, 100e9, 10e9, 100 * 10**6, batch=1)
    assert one["compute_tok_s"] == pytest.approx(100) and one["memory_tok_s"] == pytest.approx(100)
    many = cpu_peers.physical_bound(10**9, 100e9, 10e9, 100 * 10**6, batch=64)
    assert many["bound_tok_s"] == pytest.approx(100) and many["limited_by"] == "compute"
    slow_memory = cpu_peers.physical_bound(10**9, 100e9, 1e9, 100 * 10**6, batch=1)
    assert slow_memory["bound_tok_s"] == pytest.approx(10) and slow_memory["limited_by"] == "memory"


def _run(tp64: float, b1: float, tokens: list[int] | None = None) -> dict:
    return {"throughput": {"64": {"tok_s": tp64}}, "batch1_decode_tok_s": b1, **({"first_tokens": tokens} if tokens else {})}


def test_token_check_and_table(cpu_peers):
    rounds = [
        {"host:gguf": _run(300.0, 90.0, [1, 2, 3]), "vllm:bfloat16": _run(200.0, 30.0, [1, 2, 3]), "llama.cpp": {**_run(100.0, 95.0), "tg_tok_s": 100.0}},
        {"host:gguf": _run(330.0, 80.0), "vllm:bfloat16": {"error": "RuntimeError: it broke\nmore"}, "llama.cpp": {**_run(110.0, 99.0), "tg_tok_s": 110.0}},
    ]
    agreement = cpu_peers.token_agreement(rounds)
    assert agreement["tokens"] == {"host:gguf": [1, 2, 3], "vllm:bfloat16": [1, 2, 3]} and agreement["agree"] is True
    differ = cpu_peers.token_agreement([{"host:bf16": _run(1, 1, [1, 3, 3]), "hf:float32": _run(1, 1, [1, 2, 3])}])
    assert differ["agree"] is False and differ["reference"] == "hf:float32"
    assert differ["matching_prefix"] == {"host:bf16": 1, "hf:float32": 3}

    settings = {"throughput_sizes": [64], "num_prompts": 64, "b1_prompt_len": 128, "tg": 128}
    lines = cpu_peers.table({"settings": settings, "rounds": rounds, "engines": ["host:gguf", "vllm:bfloat16", "llama.cpp"],
                             "first_tokens": agreement})
    text = "\n".join(lines)
    host_row = next(line for line in lines if line.startswith("host default"))
    assert "315.0 (300-330)" in host_row and "85.0 (80-90)" in host_row  # median (range) of the two rounds
    assert "host default / best vLLM CPU (vLLM CPU bf16), 64 requests: 1.57x" in text  # 315 / 200 (its one measured round)
    assert "host default batch-1 / llama.cpp tg128: 0.81x" in text  # 85 / 105
    assert "agree across host:gguf, vllm:bfloat16" in text
    assert "round 2 vllm:bfloat16: NOT MEASURED: RuntimeError: it broke" in text


SECTION = """
import json, subprocess, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
settings = json.loads(args["--_settings"])
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # as vLLM starts VLLM::Worker
with open(settings["pid_file"], "w") as f:
    f.write(str(worker.pid))
if args["--_section"] == "hangs":
    time.sleep(300)
with open(args["--_out"], "w") as f:
    json.dump({"ok": True}, f)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie no one has reaped yet has stopped running


@pytest.mark.parametrize("section", ["finishes", "hangs"])
def test_a_section_leaves_no_process_behind(cpu_peers, tmp_path, section):
    """run_section kills the section's whole process group when it returns: a worker process the
    engine started does not outlive the section and compute beside the next one, whether the
    section finished or ran past its cap."""
    import time

    script = tmp_path / "section.py"
    script.write_text(SECTION)
    pid_file = tmp_path / "worker.pid"
    result = cpu_peers.qbench.run_section(section, {"pid_file": str(pid_file)}, timeout=10, script=str(script))
    assert result.get("ok") if section == "finishes" else "cap" in result["error"], result
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid), f"the section's worker process {pid} outlived it"
