"""Tensor-parallel linear and embedding layers (worker processes; issue 16, Megatron-style).

- :class:`ColumnParallelLinear`: the output rows split over the tensor-parallel ranks; a fused
  layer (q/k/v, gate/up) splits EACH sub-projection, so rank ``r`` holds its own part of q, of k
  and of v (``shard_rows``: which rows of each checkpoint shard). No collective.
- :class:`RowParallelLinear`: the input columns split; each rank's partial product is summed by
  one ``all_reduce``, and the bias added once, after it.
- :class:`VocabParallelEmbedding`: rank ``r`` holds a contiguous vocabulary range; ids outside it
  give zero rows, and one ``all_reduce`` sums the ranks. Also the tied LM head (:meth:`logits`).
- :class:`ParallelLMHead`: the untied LM head, vocabulary rows split; the local logits are
  all-gathered along the vocabulary and trimmed to ``vocab_size``. The range is
  ``ceil(vocab / tp)`` per rank, so when ``vocab % tp != 0`` the last ranks hold fewer rows and
  their logits are padded before the gather.

Each wrapper holds the local matmul as a child (``.linear`` / ``.embedding``) built by
:func:`make_linear` / :func:`make_embedding` with the PER-RANK sizes, so a platform that
replaces ``nn.Linear`` children (oneDNN packing) and the quantized layers (``QuantLinear`` with
the per-rank ``output_sizes``) work unchanged. ``load_checkpoint(suffix, shard, tensor)`` slices a
FULL checkpoint tensor to this rank's part before the child sees it (an online-quantized child,
int8 / fp8, then quantizes the slice). GGUF block tensors: rows slice freely; input columns only
at block boundaries — a row-parallel layer split inside a block is dequantized (logged).

The models build these only when the tensor-parallel size is above 1 (:func:`column_linear`,
:func:`row_linear`, :func:`vocab_embedding`, :func:`lm_head`); at ``-tp 1`` the factories return
today's plain modules, so an unsharded model runs exactly the same ops. Every class takes an
optional explicit ``tp_rank`` / ``tp_size`` (default: ``get_tp_group()``), which lets one
process build each rank's layer and check the sharding math.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from host.core.distributed.group import GroupCoordinator
from host.core.distributed.parallel_state import get_tp_group
from host.core.models.quant_linear import LinearFor, QuantEmbedding, QuantLinear, make_embedding, make_linear

logger = logging.getLogger("host.models")


def _is_blocks(tensor: Any) -> bool:
    """A GGUF tensor still in blocks (``GGUFTensor``), not a float tensor."""
    return not isinstance(tensor, torch.Tensor) and hasattr(tensor, "dequantize")


def _group_and_rank(tp_rank: int | None, tp_size: int | None) -> tuple[GroupCoordinator, int, int]:
    """The group whose collectives the layer calls, and this rank's place in it. An explicit
    rank/size (one process simulating the ranks) gets a one-rank group: no collective runs."""
    if tp_rank is None and tp_size is None:
        group = get_tp_group()
        return group, group.rank_in_group, group.world_size
    if tp_rank is None or tp_size is None or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank!r}, tp_size={tp_size!r}: give both, with 0 <= tp_rank < tp_size")
    return GroupCoordinator.single("tp"), tp_rank, tp_size


def tp_size_of(tp_size: int | None = None) -> int:
    """``tp_size`` when given, else the current tensor-parallel group's size."""
    return get_tp_group().world_size if tp_size is None else tp_size


def even_rows(size: int, tp_rank: int, tp_size: int, what: str = "rows") -> slice:
    """This rank's rows of a ``size``-row projection split evenly (``size % tp_size == 0``)."""
    if size % tp_size:
        raise ValueError(f"-tp {tp_size} cannot split {size} {what} evenly")
    part = size // tp_size
    return slice(tp_rank * part, (tp_rank + 1) * part)


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank keeps: its share when ``num_kv_heads >= tp``, else one (replicated)."""
    return num_kv_heads // tp_size if num_kv_heads >= tp_size else 1


def qkv_shard_rows(num_heads: int, num_kv_heads: int, head_dim: int, tp_rank: int, tp_size: int) -> list[slice]:
    """Rows of the q, k and v checkpoint tensors rank ``tp_rank`` holds.

    q heads split evenly. KV heads split evenly when ``num_kv_heads >= tp``; otherwise
    (``tp % num_kv_heads == 0``) each rank keeps the ONE kv head its q heads attend with, so
    ``tp / num_kv_heads`` ranks hold a copy of each kv head."""
    q = even_rows(num_heads, tp_rank, tp_size, "attention heads")
    if num_kv_heads >= tp_size:
        kv = even_rows(num_kv_heads, tp_rank, tp_size, "key-value heads")
    else:
        head = tp_rank // (tp_size // num_kv_heads)
        kv = slice(head, head + 1)
    q_rows = slice(q.start * head_dim, q.stop * head_dim)
    kv_rows = slice(kv.start * head_dim, kv.stop * head_dim)
    return [q_rows, kv_rows, kv_rows]


def _fits(t: int, heads: int, kv_heads: int, intermediate: int) -> bool:
    return heads % t == 0 and intermediate % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)


def valid_tp_sizes(num_heads: int, num_kv_heads: int, intermediate_size: int) -> list[int]:
    """The tensor-parallel sizes a Llama-family config can be sharded over."""
    return [t for t in range(1, num_heads + 1) if _fits(t, num_heads, num_kv_heads, intermediate_size)]


def check_tp_shardable(num_heads: int, num_kv_heads: int, intermediate_size: int, tp_size: int) -> None:
    """``ValueError`` naming the sizes that work when ``-tp tp_size`` cannot shard the model."""
    if _fits(tp_size, num_heads, num_kv_heads, intermediate_size):
        return
    if num_heads % tp_size:
        what = f"{num_heads} attention heads"
    elif intermediate_size % tp_size:
        what = f"the MLP's intermediate size {intermediate_size}"
    else:
        what = f"{num_kv_heads} key-value heads (they must divide, or be divided by, the tensor-parallel size)"
    sizes = [str(t) for t in valid_tp_sizes(num_heads, num_kv_heads, intermediate_size)]
    listed = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}"
    raise ValueError(f"-tp {tp_size} cannot split {what}; use -tp {listed}")


# -- slicing checkpoint tensors ------------------------------------------------------------------


def slice_rows(tensor: Any, rows: slice) -> Any:
    """Rows ``rows`` of a float tensor or of a GGUF block tensor (whole rows of blocks)."""
    if _is_blocks(tensor):
        return tensor.index_rows(rows)
    return tensor[rows]


def slice_columns(tensor: Any, cols: slice, layer: str, dtype: torch.dtype) -> Any:
    """Columns ``cols`` of a 2-D checkpoint tensor. A GGUF block tensor keeps its blocks when the
    cut falls on block boundaries; otherwise the layer's slice is dequantized to ``dtype``."""
    if not _is_blocks(tensor):
        return tensor[:, cols]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.qtype)]
    if cols.start % block == 0 and cols.stop % block == 0:
        data = tensor.data[:, cols.start // block * type_size : cols.stop // block * type_size].contiguous()
        return type(tensor)(data, tensor.qtype, (tensor.shape[0], cols.stop - cols.start))
    logger.warning(
        "%s: a tensor-parallel rank's %d input columns do not fall on %s's %d-column blocks; "
        "this rank's slice is dequantized to %s", layer, cols.stop - cols.start,
        GGMLQuantizationType(tensor.qtype).name, block, dtype,
    )
    return tensor.dequantize(dtype)[:, cols]


def _copy(dest: torch.Tensor, src: Any, what: str) -> None:
    if _is_blocks(src):
        src = src.dequantize(dest.dtype)
    if tuple(dest.shape) != tuple(src.shape):
        raise ValueError(
            f"checkpoint tensor for {what} has shape {tuple(src.shape)} (this rank's part) but the layer "
            f"expects {tuple(dest.shape)}; the weights do not match config.json"
        )
    dest.copy_(src)


# -- layers --------------------------------------------------------------------------------------


class ColumnParallelLinear(nn.Module):
    """``y_r = x @ W_r^T + b_r``: this rank's output rows; no collective.

    ``output_sizes`` are the FULL sizes of the checkpoint shards (q, k, v or gate, up, or one);
    ``shard_rows[i]`` the rows of shard ``i`` this rank holds (default: an even split of each).
    The child ``linear`` has the per-rank ``output_sizes`` (``[len(rows) for rows in shard_rows]``).
    """

    def __init__(
        self,
        linear_for: LinearFor | None,
        prefix: str,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        dtype: torch.dtype,
        *,
        shard_rows: list[slice] | None = None,
        tp_rank: int | None = None,
        tp_size: int | None = None,
    ) -> None:
        super().__init__()
        _, self.tp_rank, self.tp_size = _group_and_rank(tp_rank, tp_size)
        self.prefix = prefix
        if shard_rows is None:
            shard_rows = [even_rows(size, self.tp_rank, self.tp_size, f"output rows of {prefix}") for size in output_sizes]
        self.shard_rows = list(shard_rows)
        self.output_sizes = [rows.stop - rows.start for rows in self.shard_rows]
        self.in_features = input_size
        self.out_features = sum(self.output_sizes)
        self.linear = make_linear(linear_for, prefix, input_size, self.output_sizes, bias, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def load_checkpoint(self, suffix: str, shard: int, tensor: Any) -> str | None:
        """Load this rank's rows of the full checkpoint tensor of shard ``shard`` (``suffix``:
        ``weight`` or ``bias``). Returns the parameter filled (relative name), or ``None`` when a
        quantized child took the weight."""
        part = slice_rows(tensor, self.shard_rows[shard])
        if suffix == "weight" and isinstance(self.linear, QuantLinear):
            self.linear.load_shard(shard, part)
            return None
        param = getattr(self.linear, suffix)
        start = sum(self.output_sizes[:shard])
        _copy(param.data[start : start + self.output_sizes[shard]], part, f"{self.prefix}.{suffix} (shard {shard})")
        return f"linear.{suffix}"

    def extra_repr(self) -> str:
        return f"{self.prefix}: tp rank {self.tp_rank}/{self.tp_size}, out={self.output_sizes}"


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r @ W_r^T) + b``: this rank's input columns; one ``all_reduce``, the
    bias (kept here, not in the child) added once after it."""

    def __init__(
        self,
        linear_for: LinearFor | None,
        prefix: str,
        input_size: int,
        output_size: int,
        bias: bool,
        dtype: torch.dtype,
        *,
        tp_rank: int | None = None,
        tp_size: int | None = None,
    ) -> None:
        super().__init__()
        self.group, self.tp_rank, self.tp_size = _group_and_rank(tp_rank, tp_size)
        self.prefix = prefix
        self.dtype = dtype
        self.input_cols = even_rows(input_size, self.tp_rank, self.tp_size, f"input columns of {prefix}")
        self.in_features = input_size // self.tp_size
        self.out_features = output_size
        self.linear = make_linear(linear_for, prefix, self.in_features, [output_size], False, dtype)
        self.bias = nn.Parameter(torch.zeros(output_size, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.group.all_reduce(self.linear(x))
        return out if self.bias is None else out + self.bias

    def load_checkpoint(self, suffix: str, shard: int, tensor: Any) -> str | None:
        if suffix == "bias":
            _copy(self.bias.data, tensor, f"{self.prefix}.bias")
            return "bias"
        part = slice_columns(tensor, self.input_cols, self.prefix, self.dtype)
        if isinstance(self.linear, QuantLinear):
            self.linear.load_shard(0, part)
            return None
        _copy(self.linear.weight.data, part, f"{self.prefix}.weight")
        return "linear.weight"

    def extra_repr(self) -> str:
        return f"{self.prefix}: tp rank {self.tp_rank}/{self.tp_size}, in={self.in_features} of {self.in_features * self.tp_size}"


def vocab_range(vocab_size: int, tp_rank: int, tp_size: int) -> tuple[int, int, int]:
    """``(start, end, per_rank)``: rank ``tp_rank``'s vocabulary rows, ``ceil(vocab / tp)`` each
    (the last ranks hold fewer when it does not divide)."""
    per = -(-vocab_size // tp_size)
    start = min(tp_rank * per, vocab_size)
    return start, min(start + per, vocab_size), per


class _VocabSharded(nn.Module):
    """What the embedding and the LM head share: a vocabulary range and the logits gather."""

    group: GroupCoordinator
    vocab_start: int
    vocab_end: int
    per_rank: int
    vocab_size: int

    def _set_range(self, vocab_size: int, tp_rank: int | None, tp_size: int | None) -> None:
        self.group, self.tp_rank, self.tp_size = _group_and_rank(tp_rank, tp_size)
        self.vocab_size = vocab_size
        self.vocab_start, self.vocab_end, self.per_rank = vocab_range(vocab_size, self.tp_rank, self.tp_size)

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """This rank's logits [n, rows] -> every rank's, [n, vocab_size] (all_gather, padded, trimmed)."""
        if local.shape[-1] < self.per_rank:
            local = F.pad(local, (0, self.per_rank - local.shape[-1]))
        return self.group.all_gather(local, dim=-1)[..., : self.vocab_size]

    def local_rows(self, tensor: Any) -> Any:
        return slice_rows(tensor, slice(self.vocab_start, self.vocab_end))


class VocabParallelEmbedding(_VocabSharded):
    """Token embedding with rows ``[vocab_start, vocab_end)`` on this rank (child ``embedding``).

    ``forward(ids)``: rows for the ids in range, zeros for the others, summed over the ranks by
    one ``all_reduce``. ``logits(hidden)``: as the tied LM head, ``hidden @ E^T`` gathered."""

    def __init__(
        self,
        embedding_for: LinearFor | None,
        prefix: str,
        vocab_size: int,
        embedding_dim: int,
        dtype: torch.dtype,
        *,
        tp_rank: int | None = None,
        tp_size: int | None = None,
    ) -> None:
        super().__init__()
        self._set_range(vocab_size, tp_rank, tp_size)
        self.prefix = prefix
        self.embedding_dim = embedding_dim
        self.embedding = make_embedding(embedding_for, prefix, self.vocab_end - self.vocab_start, embedding_dim, dtype)

    def local_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's contribution: its rows for the ids in range, zeros elsewhere."""
        inside = (ids >= self.vocab_start) & (ids < self.vocab_end)
        rows = self.embedding(torch.where(inside, ids - self.vocab_start, 0))
        return rows.masked_fill_(~inside.unsqueeze(-1), 0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.local_embed(ids))

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embedding, QuantEmbedding):
            return self.embedding.linear(hidden)
        return F.linear(hidden, self.embedding.weight)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.gather_logits(self.local_logits(hidden))

    def load_checkpoint(self, suffix: str, shard: int, tensor: Any) -> str | None:
        part = self.local_rows(tensor)
        if isinstance(self.embedding, QuantEmbedding):
            self.embedding.load_shard(0, part)
            return None
        _copy(self.embedding.weight.data, part, f"{self.prefix}.weight")
        return "embedding.weight"

    def extra_repr(self) -> str:
        return f"{self.prefix}: vocab [{self.vocab_start}, {self.vocab_end}) of {self.vocab_size}, tp rank {self.tp_rank}/{self.tp_size}"


class ParallelLMHead(_VocabSharded):
    """Untied LM head: this rank's vocabulary rows as a child ``linear``; :meth:`logits` gathers."""

    def __init__(
        self,
        linear_for: LinearFor | None,
        prefix: str,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        *,
        tp_rank: int | None = None,
        tp_size: int | None = None,
    ) -> None:
        super().__init__()
        self._set_range(vocab_size, tp_rank, tp_size)
        self.prefix = prefix
        self.linear = make_linear(linear_for, prefix, hidden_size, [self.vocab_end - self.vocab_start], False, dtype)

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.gather_logits(self.local_logits(hidden))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden)

    def load_checkpoint(self, suffix: str, shard: int, tensor: Any) -> str | None:
        part = self.local_rows(tensor)
        if isinstance(self.linear, QuantLinear):
            self.linear.load_shard(0, part)
            return None
        _copy(self.linear.weight.data, part, f"{self.prefix}.weight")
        return "linear.weight"

    def extra_repr(self) -> str:
        return f"{self.prefix}: vocab [{self.vocab_start}, {self.vocab_end}) of {self.vocab_size}, tp rank {self.tp_rank}/{self.tp_size}"


PARALLEL_LAYERS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, ParallelLMHead)


# -- factories: today's plain modules at -tp 1 ----------------------------------------------------


def column_linear(
    linear_for: LinearFor | None, prefix: str, input_size: int, output_sizes: list[int], bias: bool, dtype: torch.dtype,
    *, shard_rows: list[slice] | None = None, tp_rank: int | None = None, tp_size: int | None = None,
) -> nn.Module:
    if tp_size_of(tp_size) == 1:
        return make_linear(linear_for, prefix, input_size, output_sizes, bias, dtype)
    return ColumnParallelLinear(
        linear_for, prefix, input_size, output_sizes, bias, dtype, shard_rows=shard_rows, tp_rank=tp_rank, tp_size=tp_size
    )


def row_linear(
    linear_for: LinearFor | None, prefix: str, input_size: int, output_size: int, bias: bool, dtype: torch.dtype,
    *, tp_rank: int | None = None, tp_size: int | None = None,
) -> nn.Module:
    if tp_size_of(tp_size) == 1:
        return make_linear(linear_for, prefix, input_size, [output_size], bias, dtype)
    return RowParallelLinear(linear_for, prefix, input_size, output_size, bias, dtype, tp_rank=tp_rank, tp_size=tp_size)


def vocab_embedding(
    embedding_for: LinearFor | None, prefix: str, vocab_size: int, embedding_dim: int, dtype: torch.dtype,
    *, tp_rank: int | None = None, tp_size: int | None = None,
) -> nn.Module:
    if tp_size_of(tp_size) == 1:
        return make_embedding(embedding_for, prefix, vocab_size, embedding_dim, dtype)
    return VocabParallelEmbedding(embedding_for, prefix, vocab_size, embedding_dim, dtype, tp_rank=tp_rank, tp_size=tp_size)


def lm_head(
    linear_for: LinearFor | None, prefix: str, hidden_size: int, vocab_size: int, dtype: torch.dtype,
    *, tp_rank: int | None = None, tp_size: int | None = None,
) -> nn.Module:
    if tp_size_of(tp_size) == 1:
        return make_linear(linear_for, prefix, hidden_size, [vocab_size], False, dtype)
    return ParallelLMHead(linear_for, prefix, hidden_size, vocab_size, dtype, tp_rank=tp_rank, tp_size=tp_size)


# -- where one model copy sits in the tensor x pipeline grid ------------------------------------


class ModelShard:
    """This rank's place for a model: tensor-parallel rank/size and pipeline stage/count, plus
    the ``--pp-layer-partition``. :meth:`current` reads the process's groups (what a worker
    builds); an explicit shard (``ModelShard(tp_rank=1, tp_size=2)``) lets one process build any
    rank's model, with no collectives."""

    def __init__(
        self,
        tp_rank: int = 0,
        tp_size: int = 1,
        pp_rank: int = 0,
        pp_size: int = 1,
        pp_layer_partition: list[int] | None = None,
        *,
        from_groups: bool = False,
        expert_parallel: bool = False,
        num_redundant_experts: int = 0,
    ) -> None:
        """``expert_parallel`` (``--enable-expert-parallel``): a mixture-of-experts model splits
        whole experts over the tensor-parallel ranks instead of each expert;
        ``num_redundant_experts`` (EPLB) adds that many physical expert slots per MoE layer."""
        if not (0 <= tp_rank < tp_size and 0 <= pp_rank < pp_size):
            raise ValueError(f"ModelShard(tp_rank={tp_rank}, tp_size={tp_size}, pp_rank={pp_rank}, pp_size={pp_size}): ranks out of range")
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, pp_rank, pp_size
        self.pp_layer_partition = pp_layer_partition
        self.from_groups = from_groups
        self.expert_parallel = expert_parallel
        self.num_redundant_experts = num_redundant_experts
        # -dp N --enable-expert-parallel: the group spanning every engine's ranks (None: the
        # experts split over this engine's tensor-parallel ranks, if at all)
        self.ep_group: Any = None

    @classmethod
    def current(
        cls, pp_layer_partition: list[int] | None = None, *, expert_parallel: bool = False, num_redundant_experts: int = 0
    ) -> "ModelShard":
        from host.core.distributed.parallel_state import get_ep_group, get_pp_group

        tp, pp = get_tp_group(), get_pp_group()
        shard = cls(tp.rank_in_group, tp.world_size, pp.rank_in_group, pp.world_size, pp_layer_partition, from_groups=True,
                    expert_parallel=expert_parallel, num_redundant_experts=num_redundant_experts)
        shard.ep_group = get_ep_group() if expert_parallel else None
        return shard

    def tp_kwargs(self) -> dict[str, int]:
        """Keyword arguments for the layers: none when the groups decide (collectives on)."""
        return {} if self.from_groups else {"tp_rank": self.tp_rank, "tp_size": self.tp_size}

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def __repr__(self) -> str:
        return f"ModelShard(tp {self.tp_rank}/{self.tp_size}, pp {self.pp_rank}/{self.pp_size})"


def check_model_parallel(hf_config: Any, parallel_config: Any) -> None:
    """Refuse, before any worker starts, a ``-tp`` / ``-pp`` the model cannot be split by (the
    same ``ValueError`` its layers would raise at load): Llama-family head and MLP sizes for
    ``-tp``, the layer partition for ``-pp``. Configs without those fields pass."""
    from host.core.models.pipeline import partition_layers

    tp, pp = parallel_config.tensor_parallel_size, parallel_config.pipeline_parallel_size
    heads = getattr(hf_config, "num_attention_heads", None)
    inter = getattr(hf_config, "intermediate_size", None)
    if tp > 1 and isinstance(heads, int) and isinstance(inter, int):
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        check_tp_shardable(heads, kv_heads, inter, tp)
    layers = getattr(hf_config, "num_hidden_layers", None)
    if pp > 1 and isinstance(layers, int):
        partition_layers(layers, pp, parallel_config.pp_layer_partition)
