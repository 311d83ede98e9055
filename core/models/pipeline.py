"""Pipeline stages on the model side (worker processes): which decoder layers a stage holds.

With ``-pp N`` every stage builds only its contiguous run of layers
(:func:`stage_layers`), keeping each layer's GLOBAL index (checkpoint names, attention
``layer_idx`` and so the KV cache map stay those of the whole model); the layers it does not hold
are :class:`MissingLayer` placeholders, so ``model.layers[i]`` is layer ``i`` on every stage.
"""

from __future__ import annotations

from torch import nn


def partition_layers(num_layers: int, pp_size: int, partition: list[int] | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` of the layers of each of ``pp_size`` stages.

    ``partition`` (``--pp-layer-partition``) gives each stage's layer count; without it the
    layers are split as evenly as possible, the ``num_layers % pp_size`` extra layers going to
    the first stages (never to the last, which also runs the final norm and the LM head). Every
    stage must hold at least one layer: a ``ValueError`` names the counts that would work.
    """
    if pp_size < 1:
        raise ValueError(f"pipeline_parallel_size={pp_size} must be >= 1")
    if partition is None:
        if num_layers < pp_size:
            raise ValueError(
                f"-pp {pp_size} needs at least one decoder layer per stage, but the model has "
                f"{num_layers}; use -pp {num_layers} or fewer"
            )
        base, extra = divmod(num_layers, pp_size)
        counts = [base + (1 if i < extra else 0) for i in range(pp_size)]
    else:
        counts = list(partition)
        if len(counts) != pp_size or any(not isinstance(c, int) or c < 1 for c in counts) or sum(counts) != num_layers:
            example = ",".join(str(c) for c in partition_counts_example(num_layers, pp_size))
            raise ValueError(
                f"--pp-layer-partition {','.join(str(c) for c in counts)} must give {pp_size} positive layer "
                f"counts summing to the model's {num_layers} layers (e.g. --pp-layer-partition {example})"
            )
    ranges, start = [], 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    return ranges


def partition_counts_example(num_layers: int, pp_size: int) -> list[int]:
    """The default split's layer counts (for error messages)."""
    base, extra = divmod(max(num_layers, pp_size), pp_size)
    return [base + (1 if i < extra else 0) for i in range(pp_size)]


def stage_layers(num_layers: int, pp_rank: int, pp_size: int, partition: list[int] | None = None) -> tuple[int, int]:
    """``(start_layer, end_layer)``: the global layer indices stage ``pp_rank`` holds."""
    return partition_layers(num_layers, pp_size, partition)[pp_rank]


class MissingLayer(nn.Module):
    """Stands where a layer another pipeline stage holds would be: no parameters, never called."""

    def forward(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("this decoder layer lives on another pipeline stage")
