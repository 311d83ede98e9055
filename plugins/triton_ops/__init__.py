"""The Triton code both GPU platforms run: the kernels (``kernels.py``), the ``triton_paged``
attention backend class (``attention.py``), the sampling kernel (``sampling.py``), the
kernels as ``torch.library`` custom ops (``custom_ops.py``) and the quantized-linear kernels
(``quant_linear.py``: ``gguf_linear``, ``int8_linear``, ``fp8_linear`` for the kernel table).

A library package, not a plugin: no entry point names it. ``builtin_cuda`` registers
:class:`~host.plugins.triton_ops.attention.TritonPagedAttentionBackend` as ``triton_paged``;
``builtin_rocm`` registers a subclass of it, ``triton_rocm`` (Triton compiles the same kernels
for AMD GPUs). It is the one package built-in plugins share (``tests/test_layering.py``).
"""
