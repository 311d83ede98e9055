"""What an ``-O`` level turns on: custom ops, decode graphs, torch.compile."""

from __future__ import annotations

from dataclasses import dataclass


def default_graph_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes captured by default: 1, 2, 4, 8, then every multiple of 16 up to
    ``max_num_seqs`` (and ``max_num_seqs`` itself), so a padded batch wastes at most 15 rows."""
    ladder = [1, 2, 4, 8] + list(range(16, max_num_seqs + 1, 16))
    sizes = sorted({s for s in ladder if s <= max_num_seqs} | {max_num_seqs})
    return sizes


@dataclass
class CompilationConfig:
    """What an ``-O`` level turns on, with explicit flags overriding the level's defaults.

    ============  ============  ==============  =====================
    level         custom ops    decode graphs   torch.compile
    ============  ============  ==============  =====================
    ``-O0``       off           off             off
    ``-O1``       on            off             off
    ``-O2``       on            on              off   (the default)
    ``-O3``       on            on              on
    ============  ============  ==============  =====================

    *Custom ops* are the platform's fused kernels (norms, rotary, SiLU-and-mul, sampling).
    *Decode graphs* are device graphs (CUDA / HIP graphs) of whole decode steps, captured for a
    ladder of batch sizes; a platform that cannot capture graphs leaves them off unless asked
    for explicitly, which is then an error. ``None`` in a field means "the level decides";
    :meth:`resolve` fills every field. ``enforce_eager`` turns graphs and compilation off and
    conflicts with asking for either.
    """

    level: int = 2
    custom_ops: bool | None = None
    torch_compile: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graph_sizes: list[int] | None = None
    enforce_eager: bool = False
    # which fields the user set (kept for the start-up line and error messages)
    explicit: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.level not in (0, 1, 2, 3):
            raise ValueError(f"optimization_level={self.level} must be 0, 1, 2 or 3 (-O0 ... -O3)")
        explicit = [n for n in ("custom_ops", "torch_compile", "cuda_graphs", "cuda_graph_sizes") if getattr(self, n) is not None]
        if self.enforce_eager:
            clash = [n for n in ("torch_compile", "cuda_graphs") if getattr(self, n)]
            if self.cuda_graph_sizes:
                clash.append("cuda_graph_sizes")
            if clash:
                raise ValueError(
                    f"enforce_eager conflicts with {', '.join(clash)}: eager mode captures no graphs "
                    "and compiles nothing; drop --enforce-eager or the other flag"
                )
            explicit.append("enforce_eager")
        if self.cuda_graph_sizes is not None:
            bad = [s for s in self.cuda_graph_sizes if not isinstance(s, int) or s < 1]
            if bad:
                raise ValueError(f"cuda_graph_sizes={self.cuda_graph_sizes} must be positive integers, e.g. 1,2,4,8")
            if self.cuda_graphs is False and self.cuda_graph_sizes:
                raise ValueError("cuda_graph_sizes given with cuda_graphs off; drop one of them")
        self.explicit = tuple(dict.fromkeys([*self.explicit, *explicit]))

    def resolve(self, max_num_seqs: int, platform_can_capture: bool) -> None:
        """Fill every ``None`` from the level, then apply ``enforce_eager``; ask for graphs on a
        platform that cannot capture them and get a ``ValueError``."""
        if self.custom_ops is None:
            self.custom_ops = self.level >= 1
        wants_graphs = self.cuda_graphs if self.cuda_graphs is not None else (bool(self.cuda_graph_sizes) if self.cuda_graph_sizes is not None else None)
        if self.torch_compile is None:
            self.torch_compile = self.level >= 3 and not self.enforce_eager
        if wants_graphs is None:
            wants_graphs = self.level >= 2 and not self.enforce_eager and platform_can_capture
        elif wants_graphs and not platform_can_capture:
            raise ValueError(
                "decode graphs were asked for (--cuda-graph-sizes, or cuda_graphs=True) but this platform "
                "cannot capture device graphs; drop the flag or use -O1"
            )
        self.cuda_graphs = wants_graphs
        if wants_graphs:
            sizes = self.cuda_graph_sizes or default_graph_sizes(max_num_seqs)
            self.cuda_graph_sizes = sorted({s for s in sizes if s <= max_num_seqs}) or [max_num_seqs]
        else:
            self.cuda_graph_sizes = []

    def describe(self) -> str:
        graphs = "off"
        if self.cuda_graphs and self.cuda_graph_sizes:
            s = self.cuda_graph_sizes
            graphs = f"batch sizes {s[0]}..{s[-1]} ({len(s)} graphs)"
        parts = [
            f"-O{self.level}",
            f"custom ops {'on' if self.custom_ops else 'off'}",
            f"torch.compile {'on' if self.torch_compile else 'off'}",
            f"decode graphs {graphs}",
        ]
        text = "; ".join(parts)
        if self.explicit:
            text += f" (set explicitly: {', '.join(self.explicit)})"
        return text
