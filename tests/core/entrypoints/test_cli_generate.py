"""``host generate`` and ``host chat`` on the default model, as a user runs them (the module's
three commands start at once: helpers.host_runs)."""

from __future__ import annotations

import pytest

from helpers import host_runs


@pytest.fixture(scope="module")
def runs():
    calls = {
        "generate": ["generate", "The capital of France is", "--max-tokens", "6", "--max-model-len", "256"],
        "bad_flags": ["generate", "hi", "--max-model-len", "999999"],
        "chat": ["chat", "--max-tokens", "24"],
    }
    with host_runs(calls, inputs={"chat": "What is the capital of France?\nAnd of Italy?\n\n"}) as started:
        yield started


def test_generate_prints_the_completion(runs):
    proc = runs["generate"].result()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is")
    assert "Paris" in proc.stdout


def test_generate_reports_bad_flags_clearly(runs):
    proc = runs["bad_flags"].result()
    assert proc.returncode == 2
    assert "max_model_len=999999 exceeds" in proc.stderr


def test_chat_streams_a_reply_and_keeps_history(runs):
    proc = runs["chat"].result()
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert "Paris" in lines[0]
    assert "Rome" in proc.stdout  # the second turn saw the first one
