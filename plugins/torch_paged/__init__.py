"""The built-in ``torch_paged`` attention backend: paged attention in plain torch ops, on any
device (entry point ``host.attention_backends: torch_paged``).

``attention.py`` holds the backend and its impl, ``metadata.py`` the per-step batch layout they
share across layers. The CPU platform's ``cpu_paged`` is this algorithm plus a compiled decode
kernel; the CUDA and ROCm platforms list ``torch_paged`` after their Triton backends.
"""
