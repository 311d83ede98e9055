"""Filling a model's parameters from checkpoint tensors: the shape check, the fused-shard
bookkeeping and the completeness check that every weight loader shares (the Llama family's
``load_weights`` and the EAGLE head's). Each failure is a ``ValueError`` naming the tensor or
the parameters and the loader's own fix."""

from __future__ import annotations

from typing import Any

import torch


def fused_shards(param_name: str) -> set[Any]:
    """The checkpoint shards a parameter is assembled from: q/k/v for a fused ``qkv_proj``, 0/1
    for a fused ``gate_up_proj``, ``{None}`` (one tensor) for any other."""
    module = param_name.rsplit(".", 1)[0].removesuffix(".linear")  # a tensor-parallel layer's child
    if module.endswith("qkv_proj"):
        return {"q", "k", "v"}
    if module.endswith("gate_up_proj"):
        return {0, 1}
    return {None}


def copy_into(param: torch.nn.Parameter, rows: slice | None, tensor: torch.Tensor, *, label: str, target: str,
              fix: str) -> None:
    """Copy ``tensor`` into ``param`` (its ``rows`` only, for one shard of a fused parameter);
    a shape mismatch is an error naming ``label`` (e.g. the checkpoint name), ``target`` and ``fix``."""
    dest = param.data if rows is None else param.data[rows]
    if dest.shape != tensor.shape:
        raise ValueError(f"{label} has shape {tuple(tensor.shape)} but {target} expects {tuple(dest.shape)}; {fix}")
    dest.copy_(tensor)


def check_complete(params: dict[str, Any], filled: dict[str, set[Any]], *, source: str, fix: str) -> None:
    """Every parameter got all its shards (``filled[name]``: the shard ids copied in); else an
    error naming up to six of the missing ones, what they were loaded from and ``fix``."""
    missing = sorted(p for p in params if filled.get(p, set()) != fused_shards(p))
    if missing:
        raise ValueError(
            f"{source} has no (or only partial) weights for {len(missing)} parameter(s), "
            f"e.g. {', '.join(missing[:6])}; {fix}"
        )
