"""Frees fenced behind steps in flight (a KV connector with asynchronous scheduling or a
pipeline): a block freed while a step planned earlier is unprocessed stays allocated until that
step is processed, so a load into a reallocated block can never race the step's write."""

from host.contracts.request import Request
from host.core.config import KVTransferConfig
from host.core.kv_cache.manager import KVCacheManager
from host.core.kv_transfer.scheduler import KVTransferFeature
from host.sdk.kv_connector import KVConnector, KVConnectorRole


def _state(fence: bool):
    kv = KVCacheManager(num_blocks=9, block_size=4)
    config = KVTransferConfig(kv_connector="unused_here")
    return kv, KVTransferFeature(KVConnector(None, KVConnectorRole.SCHEDULER), config, kv, fence_frees=fence)


def test_a_free_waits_for_every_step_planned_before_it():
    kv, state = _state(fence=True)
    a = Request("a", list(range(10)))
    assert kv.allocate_slots(a, 10) is not None  # 3 blocks
    s1, s2 = state.next_seq(), state.next_seq()  # two steps in flight
    state.free(a)
    assert kv.num_free_blocks == 5  # still held
    state.step_processed(s1)
    assert kv.num_free_blocks == 5  # s2 was planned before the free too
    s3 = state.next_seq()  # planned after the free: not a fence for it
    state.step_processed(s2)
    assert kv.num_free_blocks == 8
    state.step_processed(s3)
    assert kv.num_free_blocks == 8 and not state.deferred


def test_without_steps_in_flight_a_free_is_immediate():
    for fence in (True, False):
        kv, state = _state(fence)
        a = Request("a", list(range(5)))
        kv.allocate_slots(a, 5)
        if fence:
            state.step_processed(state.next_seq())  # everything processed
        else:
            state.next_seq()  # no fencing: in-flight steps do not matter
        state.free(a)
        assert kv.num_free_blocks == 8
