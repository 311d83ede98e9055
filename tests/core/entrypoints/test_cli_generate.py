"""``host generate`` and ``host chat`` on the default model, as a user runs them."""

from __future__ import annotations

import subprocess

from helpers import HOST_BIN, subprocess_env


def test_generate_prints_the_completion():
    proc = subprocess.run(
        [HOST_BIN, "generate", "The capital of France is", "--max-tokens", "6", "--max-model-len", "256"],
        capture_output=True, text=True, env=subprocess_env([]), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is")
    assert "Paris" in proc.stdout


def test_generate_reports_bad_flags_clearly():
    proc = subprocess.run(
        [HOST_BIN, "generate", "hi", "--max-model-len", "999999"],
        capture_output=True, text=True, env=subprocess_env([]), timeout=300,
    )
    assert proc.returncode == 2
    assert "max_model_len=999999 exceeds" in proc.stderr


def test_chat_streams_a_reply_and_keeps_history():
    proc = subprocess.run(
        [HOST_BIN, "chat", "--max-tokens", "24"],
        input="What is the capital of France?\nAnd of Italy?\n\n",
        capture_output=True, text=True, env=subprocess_env([]), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert "Paris" in lines[0]
    assert "Rome" in proc.stdout  # the second turn saw the first one
