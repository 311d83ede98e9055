"""Engine flags on the real ``host generate``: parsed, passed to the engine, and a bad plugin
name reported as a one-line error that lists what is registered (the module's three commands
start at once: helpers.host_runs)."""

from __future__ import annotations

import pytest

from helpers import host_runs

PROMPT = ["generate", "The capital of France is", "--max-tokens", "6", "--max-model-len", "256"]


@pytest.fixture(scope="module")
def runs():
    calls = {
        "flags": [*PROMPT, "--attention-backend", "cpu_paged", "--distributed-executor-backend", "uniproc", "-O1",
                  "--kv-cache-memory", "64MiB", "--max-num-seqs", "4", "--no-enable-prefix-caching", "--seed", "3"],
        "backend": [*PROMPT, "--attention-backend", "flash"],
        "executor": [*PROMPT, "--distributed-executor-backend", "nosuch"],
    }
    with host_runs(calls) as started:
        yield started


def test_engine_flags_reach_the_engine(runs):
    proc = runs["flags"].result()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is") and "Paris" in proc.stdout


def test_unknown_attention_backend_lists_the_registered_ones(runs):
    proc = runs["backend"].result()
    assert proc.returncode == 2, proc.stderr
    assert "error: --attention-backend 'flash' is not registered; registered backends:" in proc.stderr
    assert "cpu_paged" in proc.stderr


def test_unknown_executor_lists_the_registered_ones(runs):
    proc = runs["executor"].result()
    assert proc.returncode == 2, proc.stderr
    assert "error: distributed_executor_backend='nosuch' is not registered; registered executors:" in proc.stderr
    assert "uniproc" in proc.stderr
