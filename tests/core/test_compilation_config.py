"""``-O`` levels and the flags that override them (``CompilationConfig``), and the CLI parsing."""

from __future__ import annotations

import pytest
import typer

from host.core.config import CompilationConfig, default_graph_sizes
from host.core.entrypoints.cli.engine_flags import engine_flag_kwargs


def resolved(can_capture: bool = True, max_num_seqs: int = 64, **kw) -> CompilationConfig:
    c = CompilationConfig(**kw)
    c.resolve(max_num_seqs, can_capture)
    return c


@pytest.mark.parametrize(
    "level, ops, graphs, compiled",
    [(0, False, False, False), (1, True, False, False), (2, True, True, False), (3, True, True, True)],
)
def test_level_defaults(level, ops, graphs, compiled):
    c = resolved(level=level)
    assert (c.custom_ops, c.cuda_graphs, c.torch_compile) == (ops, graphs, compiled)
    assert bool(c.cuda_graph_sizes) == graphs
    assert f"-O{level}" in c.describe()


def test_explicit_flags_override_the_level():
    c = resolved(level=0, custom_ops=True, cuda_graph_sizes=[4, 1, 2])
    assert c.custom_ops and c.cuda_graphs and c.cuda_graph_sizes == [1, 2, 4] and not c.torch_compile
    assert "custom_ops" in c.describe() and "cuda_graph_sizes" in c.describe()
    c = resolved(level=3, custom_ops=False, torch_compile=False, cuda_graphs=False)
    assert (c.custom_ops, c.torch_compile, c.cuda_graphs, c.cuda_graph_sizes) == (False, False, False, [])
    c = resolved(level=1, torch_compile=True)
    assert c.torch_compile and not c.cuda_graphs


def test_enforce_eager():
    c = resolved(level=3, enforce_eager=True)
    assert not c.cuda_graphs and not c.torch_compile and c.custom_ops  # kernels are not graphs
    with pytest.raises(ValueError, match="enforce_eager conflicts with torch_compile"):
        CompilationConfig(enforce_eager=True, torch_compile=True)
    with pytest.raises(ValueError, match="enforce_eager conflicts with cuda_graph_sizes"):
        CompilationConfig(enforce_eager=True, cuda_graph_sizes=[1, 2])


def test_graphs_need_a_platform_that_captures():
    assert not resolved(level=2, can_capture=False).cuda_graphs  # the level's default steps aside
    with pytest.raises(ValueError, match="cannot capture device graphs"):
        resolved(level=2, can_capture=False, cuda_graph_sizes=[1, 2])
    with pytest.raises(ValueError, match="cannot capture device graphs"):
        resolved(level=1, can_capture=False, cuda_graphs=True)


def test_graph_sizes():
    assert default_graph_sizes(256)[:5] == [1, 2, 4, 8, 16] and default_graph_sizes(256)[-1] == 256
    assert default_graph_sizes(100)[-1] == 100 and 96 in default_graph_sizes(100)
    assert default_graph_sizes(3) == [1, 2, 3]
    assert resolved(max_num_seqs=8, cuda_graph_sizes=[2, 64]).cuda_graph_sizes == [2]  # beyond max_num_seqs: dropped
    with pytest.raises(ValueError, match="positive integers"):
        CompilationConfig(cuda_graph_sizes=[0, 2])
    with pytest.raises(ValueError, match="optimization_level=4"):
        CompilationConfig(level=4)


def test_cli_flags():
    unset = dict(optimization_level=None, enforce_eager=False, custom_ops=None, torch_compile=None, cuda_graph_sizes=None)
    assert engine_flag_kwargs(**unset) == {}
    assert engine_flag_kwargs(**{**unset, "optimization_level": 3, "enforce_eager": True, "custom_ops": False, "cuda_graph_sizes": "none"}) == {
        "optimization_level": 3, "enforce_eager": True, "custom_ops": False, "cuda_graphs": False,
    }
    assert engine_flag_kwargs(**{**unset, "torch_compile": True, "cuda_graph_sizes": "1,2, 8"}) == {"torch_compile": True, "cuda_graph_sizes": [1, 2, 8]}
    assert engine_flag_kwargs(**{**unset, "kv_cache_memory": "2GiB", "max_num_seqs": None}) == {"kv_cache_memory": 2 * 2**30}
    with pytest.raises(typer.BadParameter, match="--cuda-graph-sizes|batch sizes"):
        engine_flag_kwargs(**{**unset, "cuda_graph_sizes": "1,x"})
