"""The built-in ROCm platform (AMD GPUs through HIP)."""
