"""A third-party quantization method, pip-installed from tests/fixtures/quantint4, is offered by
the CLI, listed by ``host platform``, and runs when selected: the engine's tokens equal
transformers' on the same int4-rounded weights."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from helpers import hf_greedy, hf_model, on_sys_path, run_hosts, subprocess_env

PROMPT = [3, 17, 42, 9, 101, 5]
SCRIPT = """
import json, sys
from host import LLM, SamplingParams
llm = LLM(sys.argv[1], skip_tokenizer_init=True, quantization="int4_sym", num_gpu_blocks_override=32)
layer = llm.engine.executor.worker.model_runner.model.model.layers[0].mlp.down_proj
out = llm.generate([{"prompt_token_ids": %r}], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
print(json.dumps({"scheme": layer.scheme, "tokens": out[0].outputs[0].token_ids}))
llm.shutdown()
""" % (PROMPT,)


def test_third_party_method_is_selected_and_runs(fixture_sites, tiny_checkpoint):
    site = fixture_sites["quantint4"]
    path = tiny_checkpoint("llama", norm_std=0.1, lm_head_scale=4.0)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True,
                          env=subprocess_env([site]), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["scheme"] == "int4_sym"
    with on_sys_path(site):
        from host_fixture_quantint4 import dequantize_int4, quantize_int4
    reference = hf_model(path)
    with torch.no_grad():
        for name, module in reference.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                module.weight.copy_(dequantize_int4(*quantize_int4(module.weight)))
    assert result["tokens"] == hf_greedy(reference, PROMPT, 10)


def test_the_cli_offers_installed_methods(fixture_sites):
    site = fixture_sites["quantint4"]
    listed, refused = run_hosts((["platform", "--json"], [site]), (["generate", "--quantization", "int5", "hello"], [site]))
    assert listed.returncode == 0, listed.stderr
    methods = {m["name"]: m for m in json.loads(listed.stdout)["quantization_methods"]}
    assert {"gguf", "int8", "fp8", "int4_sym"} <= set(methods)
    assert methods["int4_sym"]["plugin"] == "fixture_int4" and methods["int4_sym"]["runs_here"]["float32"] is None
    assert refused.returncode == 2
    assert "'int5' is not a registered quantization method" in refused.stderr
    assert "int4_sym" in refused.stderr and "gguf" in refused.stderr
