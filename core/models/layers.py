"""Small building blocks shared by the decoder models: RMSNorm, SiLU-GLU, rotary embeddings.

Numerics follow the Hugging Face reference implementations, so a model built from these blocks
gives the same logits as ``transformers`` for the same weights: RMSNorm normalizes in float32
and casts back before the weight multiply, and RoPE's cos/sin are computed in float32 and then
cast to the model dtype.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Llama, Qwen); also used per head for Qwen3's q/k norm.

    ``forward(x)`` returns the normalized ``x``. ``forward(x, residual)`` first adds: it returns
    ``(norm(x + residual), x + residual)`` — the pre-norm decoder's residual stream in one call,
    so a platform kernel can do the add and the norm in one pass.

    A platform may set ``kernel`` (see :meth:`host.interfaces.platform.Platform.prepare_model`) to a
    callable with the same contract, ``kernel(x, residual, weight, eps)``; it is used for the
    dtypes in ``kernel_dtypes`` and may update ``x`` and ``residual`` in place.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps = eps
        self.kernel: Callable[..., Any] | None = None
        self.kernel_dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # a kernel takes x and the weight in one dtype (GemmaRMSNorm keeps its weight in float32)
        if self.kernel is not None and x.dtype in self.kernel_dtypes and x.dtype == self.weight.dtype:
            return self.kernel(x, residual, self.weight, self.eps)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        if input_dtype == torch.float32:
            # one fused op; same arithmetic as the float32 path below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class SiluAndMul(nn.Module):
    """The gated activation of a SiLU-GLU MLP: ``silu(x[..., :d]) * x[..., d:]``.

    Takes the output of the fused gate/up projection, so one matmul feeds both halves. A
    platform may set ``kernel(x)`` (used for ``kernel_dtypes``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.kernel: Callable[..., Any] | None = None
        self.kernel_dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dtype in self.kernel_dtypes and x.dim() == 2:
            return self.kernel(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


# -- rotary position embeddings -------------------------------------------------------------


def rope_parameters_from_config(config: Any) -> dict[str, Any]:
    """The RoPE settings of a Hugging Face config as one flat dict with ``rope_type`` and
    ``rope_theta`` always present.

    transformers 5 stores them in ``config.rope_parameters`` (``rope_theta`` included); older
    configs have ``rope_theta`` next to an optional ``rope_scaling`` dict (whose type key may be
    the legacy ``type``). Both are accepted.
    """
    params = getattr(config, "rope_parameters", None)
    if not params:
        params = getattr(config, "rope_scaling", None)
    params = dict(params or {})
    if "rope_type" not in params:
        params["rope_type"] = params.pop("type", "default")
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(config, "rope_theta", None) or 10000.0
    if params.get("partial_rotary_factor") is None and getattr(config, "partial_rotary_factor", None):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    if params["rope_type"] in ("llama3", "yarn", "longrope") and not params.get("original_max_position_embeddings"):
        params["original_max_position_embeddings"] = getattr(
            config, "original_max_position_embeddings", None
        ) or config.max_position_embeddings
    return params


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are divided by factor, short ones kept, the band in between blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def _yarn_inv_freq(
    params: dict[str, Any], dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    base = params["rope_theta"]
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if params.get("mscale") and params.get("mscale_all_dim"):
            attention_factor = mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _longrope_inv_freq(
    params: dict[str, Any], dim: int, max_position_embeddings: int, context_len: int | None
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3 / Phi-4-mini): per-frequency divisors, ``short_factor`` or
    ``long_factor``, and a cos/sin scale of ``sqrt(1 + log(factor) / log(original))``.

    The factor set is fixed for the whole table: ``long_factor`` when ``context_len`` (the longest
    sequence the engine runs; default ``max_position_embeddings``) exceeds
    ``original_max_position_embeddings``, else ``short_factor``. See :class:`RotaryEmbedding`.
    """
    original = int(params["original_max_position_embeddings"])
    factor = params.get("factor") or max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    use_long = (context_len or max_position_embeddings) > original
    key = "long_factor" if use_long else "short_factor"
    ext = params.get(key)
    if ext is None or len(ext) != dim // 2:
        raise ValueError(
            f"rope_scaling {key}={ext!r} must be a list of rotary_dim/2 = {dim // 2} numbers for longrope; "
            "fix the checkpoint's config.json"
        )
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * params["rope_theta"] ** exponents), float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (rotate-half / NeoX layout, as Hugging Face Llama uses) with a
    precomputed cos/sin table indexed by token position.

    The table covers ``max_positions`` positions; :meth:`cos_sin` is one gather per forward,
    shared by every layer, so nothing depends on the batch layout (flattened tokens of many
    sequences at arbitrary positions work). Supported ``rope_type``: default, linear, dynamic
    (NTK), llama3, yarn, longrope. ``partial_rotary_factor`` rotates only the first
    ``rotary_dim = head_dim * factor`` dims of each head.

    ``dynamic`` is position-wise here: positions below ``max_position_embeddings`` use the
    unscaled frequencies (what Hugging Face uses while a sequence fits), positions beyond use
    the frequencies Hugging Face would use for a sequence of ``max_positions`` tokens.

    ``longrope`` is static per engine: transformers picks ``short_factor`` or ``long_factor`` per
    forward from the longest position in it (and recomputes the whole KV cache when a generation
    crosses ``original_max_position_embeddings``), which a paged, prefix-cached KV cache cannot
    do. Here ``context_len`` (the engine's max_model_len) decides once: long factors when it
    exceeds ``original_max_position_embeddings``, else short ones (llama.cpp's rule). Outputs
    equal transformers' whenever transformers would use the same set: every sequence when
    ``context_len`` is within the original length, sequences longer than it otherwise.
    """

    def __init__(
        self,
        head_dim: int,
        rope_params: dict[str, Any],
        max_position_embeddings: int,
        dtype: torch.dtype = torch.float32,
        context_len: int | None = None,
    ) -> None:
        super().__init__()
        rope_type = rope_params.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type={rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )
        self.head_dim = head_dim
        self.rotary_dim = int(head_dim * rope_params.get("partial_rotary_factor", 1.0))
        self.rope_type = rope_type
        base = float(rope_params["rope_theta"])
        dim = self.rotary_dim
        factor = float(rope_params.get("factor") or 1.0)
        attention_factor = 1.0
        max_positions = max_position_embeddings
        if rope_type == "default":
            inv_freq = _base_inv_freq(base, dim)
        elif rope_type == "linear":
            inv_freq = _base_inv_freq(base, dim) / factor
            max_positions = int(max_position_embeddings * factor)
        elif rope_type == "llama3":
            inv_freq = _llama3_inv_freq(_base_inv_freq(base, dim), rope_params)
        elif rope_type == "yarn":
            inv_freq, attention_factor = _yarn_inv_freq(rope_params, dim, max_position_embeddings)
            max_positions = max(
                max_position_embeddings, int(rope_params["original_max_position_embeddings"] * factor)
            )
        elif rope_type == "longrope":
            inv_freq, attention_factor = _longrope_inv_freq(rope_params, dim, max_position_embeddings, context_len)
        else:  # dynamic NTK
            inv_freq = _base_inv_freq(base, dim)
            max_positions = int(max_position_embeddings * factor)
        self.max_positions = max_positions
        positions = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
        freqs = torch.outer(positions, inv_freq)
        if rope_type == "dynamic" and max_positions > max_position_embeddings:
            scaled_base = base * (factor * max_positions / max_position_embeddings - (factor - 1)) ** (
                dim / (dim - 2)
            )
            tail = positions[max_position_embeddings:]
            freqs[max_position_embeddings:] = torch.outer(tail, _base_inv_freq(scaled_base, dim))
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1) * attention_factor
        self.register_buffer("cos_sin_cache", cache.to(dtype), persistent=False)
        # a platform's in-place rotation kernel(x, positions, cos_sin_cache) for
        # x [num_tokens, num_heads, head_dim] (see RopeBatch), used for kernel_dtypes
        self.kernel: Callable[..., Any] | None = None
        self.kernel_dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for each token, each [num_tokens, rotary_dim] (halves repeated)."""
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)

    def prepare(self, positions: torch.Tensor) -> "RopeBatch":
        """The per-forward rotation state for these token positions, shared by every layer."""
        if self.kernel is not None and self.cos_sin_cache.dtype in self.kernel_dtypes:
            return RopeBatch(self, positions, None, None)
        cos, sin = self.cos_sin(positions)
        return RopeBatch(self, positions, cos, sin)


class RopeBatch:
    """What :meth:`RotaryEmbedding.prepare` computed once per forward: either the gathered
    cos/sin rows (torch path) or just the positions (a platform kernel reads the table)."""

    __slots__ = ("emb", "positions", "cos", "sin")

    def __init__(
        self, emb: RotaryEmbedding, positions: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None
    ) -> None:
        self.emb, self.positions, self.cos, self.sin = emb, positions, cos, sin

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [num_tokens, num_heads, head_dim]; the result may be ``x`` itself,
        rotated in place (kernel path) — callers must use the return value."""
        if self.cos is None:
            self.emb.kernel(x, self.positions, self.emb.cos_sin_cache)
            return x
        return apply_rotary(x, self.cos, self.sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [num_tokens, num_heads, head_dim] by per-token ``cos``/``sin``
    [num_tokens, rotary_dim]; dims past ``rotary_dim`` pass through unchanged."""
    rotary_dim = cos.shape[-1]
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    out = x_rot * cos + rotated_half * sin
    if x_pass.shape[-1] == 0:
        return out
    return torch.cat([out, x_pass], dim=-1)


def set_layer_kernels(
    model: nn.Module,
    *,
    rms_norm: Callable[..., Any] | None = None,
    silu_and_mul: Callable[..., Any] | None = None,
    rotary: Callable[..., Any] | None = None,
    dtypes: tuple[torch.dtype, ...] = (torch.float32,),
) -> int:
    """Give every :class:`RMSNorm`, :class:`SiluAndMul` and :class:`RotaryEmbedding` of
    ``model`` a platform kernel (each with the contract of that layer's ``kernel`` attribute),
    used for ``dtypes``. Returns how many modules got one."""
    count = 0
    for module in model.modules():
        if isinstance(module, RMSNorm):
            kernel = rms_norm
        elif isinstance(module, SiluAndMul):
            kernel = silu_and_mul
        elif isinstance(module, RotaryEmbedding):
            kernel = rotary
        else:
            continue
        if kernel is None:
            continue
        module.kernel = kernel
        module.kernel_dtypes = dtypes
        count += 1
    return count


LAYER_KERNEL_OPS = ("rms_norm", "silu_and_mul", "rotary_embedding")
"""The kernel-table ops a model's layers run when a platform kernel is offered: ``rms_norm`` with
:class:`RMSNorm`'s ``kernel`` contract, ``silu_and_mul`` with :class:`SiluAndMul`'s,
``rotary_embedding`` with :class:`RotaryEmbedding`'s. There is no ``"*"`` reference: without a
device kernel each layer keeps its torch path."""


def attach_layer_kernels(model: nn.Module, device_type: str) -> int:
    """Give the layers of ``model`` the best kernel the kernel table offers for ``device_type``
    (``host_offer_kernels``; a kernel's ``dtypes`` attribute names the dtypes it takes, float32
    without one). Returns how many modules got one."""
    from host.interfaces.kernels import kernel_candidates

    chosen = {}
    for op in LAYER_KERNEL_OPS:
        own = [e for e in kernel_candidates(op, device_type) if e.device_type == device_type]
        if own:
            chosen[op] = own[0].impl
    count = 0
    for op, impl in chosen.items():
        dtypes = tuple(getattr(impl, "dtypes", (torch.float32,)))
        count += set_layer_kernels(model, dtypes=dtypes, **{op if op != "rotary_embedding" else "rotary": impl})
    return count
