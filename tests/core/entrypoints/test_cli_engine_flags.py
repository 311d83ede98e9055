"""Engine flags on the real ``host generate``: parsed, passed to the engine, and a bad plugin
name reported as a one-line error that lists what is registered."""

from __future__ import annotations

import subprocess

from helpers import HOST_BIN, subprocess_env


def generate(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HOST_BIN, "generate", "The capital of France is", "--max-tokens", "6", "--max-model-len", "256", *flags],
        capture_output=True, text=True, env=subprocess_env([]), timeout=300,
    )


def test_engine_flags_reach_the_engine():
    proc = generate(
        "--attention-backend", "cpu_paged", "--distributed-executor-backend", "uniproc", "-O1",
        "--kv-cache-memory", "64MiB", "--max-num-seqs", "4", "--no-enable-prefix-caching", "--seed", "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is") and "Paris" in proc.stdout


def test_unknown_attention_backend_lists_the_registered_ones():
    proc = generate("--attention-backend", "flash")
    assert proc.returncode == 2, proc.stderr
    assert "error: --attention-backend 'flash' is not registered; registered backends:" in proc.stderr
    assert "cpu_paged" in proc.stderr


def test_unknown_executor_lists_the_registered_ones():
    proc = generate("--distributed-executor-backend", "nosuch")
    assert proc.returncode == 2, proc.stderr
    assert "error: distributed_executor_backend='nosuch' is not registered; registered executors:" in proc.stderr
    assert "uniproc" in proc.stderr
