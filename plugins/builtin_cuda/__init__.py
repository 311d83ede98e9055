"""The built-in CUDA platform (NVIDIA GPUs)."""
