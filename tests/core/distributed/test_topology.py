"""The rank grid of seed §8.1, with W = 8 and no processes."""

import pytest

from host.core.distributed.topology import group_of, rank_grid


def _partitions(groups, world):
    flat = sorted(r for g in groups for r in g)
    return flat == list(range(world))


def test_the_seed_example_tp2_pp4():
    groups = rank_grid(8, tp=2, pp=4)
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # contiguous runs
    assert groups["pp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]  # stride TP
    assert groups["dp"] == [[r] for r in range(8)]


@pytest.mark.parametrize("tp, pp, dp", [(2, 2, 2), (8, 1, 1), (1, 8, 1), (1, 1, 8), (4, 2, 1), (2, 1, 4)])
def test_every_dimension_partitions_the_world(tp, pp, dp):
    groups = rank_grid(8, tp, pp, dp, moe=True)
    for name, size in (("tp", tp), ("pp", pp), ("dp", dp), ("ep", dp * tp)):
        assert _partitions(groups[name], 8), name
        assert all(len(g) == size for g in groups[name]), name
    # a rank's TP peers differ from it only in the TP coordinate: rank = (d * pp + p) * tp + t
    for rank in range(8):
        d, p, t = rank // (pp * tp), (rank // tp) % pp, rank % tp
        assert group_of(groups["tp"], rank) == [(d * pp + p) * tp + i for i in range(tp)]
        assert group_of(groups["pp"], rank) == [(d * pp + i) * tp + t for i in range(pp)]
        assert group_of(groups["dp"], rank) == [(i * pp + p) * tp + t for i in range(dp)]


def test_ep_exists_only_for_moe_and_spans_dp_times_tp():
    assert "ep" not in rank_grid(8, 2, 2, 2)
    assert rank_grid(8, 2, 2, 2, moe=True)["ep"] == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_a_world_that_is_not_the_product_is_refused():
    with pytest.raises(ValueError, match="world_size=6 must equal"):
        rank_grid(6, tp=4)
