"""An ``n > 1`` prompt is ``n`` engine requests; when sending them fails part-way, the ones
already sent must be aborted (the finding: a 500 while encoding a request for the engine, and 15
of 16 sequences kept running with no client). Request validation now refuses the values that
failed to encode, so the failure is injected into the transport: the real engine client and
engine process, with the client's send failing for the fourth child."""

from __future__ import annotations

import asyncio

from host.contracts.sampling_params import SamplingParams
from host.core.engine_args import EngineArgs
from host.core.frontend.async_llm import AsyncLLM


async def _settled(llm: AsyncLLM, timeout: float = 2.0):
    """The engine's own stats once nothing runs or waits, within a bound far below the seconds
    the children's 240 tokens would run if nothing aborted them (aborts free within 1 s)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        stats = await llm.utility("stats")  # SchedulerStats' fields, as a dict over the wire
        if stats.get("num_running_reqs", 0) == 0 and stats.get("num_waiting_reqs", 0) == 0:
            return stats
        assert asyncio.get_running_loop().time() < deadline, f"the engine still holds requests: {stats}"
        await asyncio.sleep(0.1)


def test_a_failure_while_adding_children_aborts_the_ones_already_sent():
    async def main() -> None:
        config = EngineArgs(max_model_len=256, max_num_seqs=16).create_engine_config()
        llm = await AsyncLLM.start(config)
        try:
            real_add = llm.engine_core.add_request_async
            sent: list[str] = []

            async def add_then_fail(request) -> None:
                if len(sent) == 3:
                    raise OverflowError("the fourth child could not be encoded")
                sent.append(request.request_id)
                await real_add(request)

            llm.engine_core.add_request_async = add_then_fail
            ids = llm.tokenizer.encode("Once upon a time")
            params = SamplingParams(n=8, max_tokens=240, ignore_eos=True, temperature=1.0)
            gen = llm.generate(ids, params, "parent")
            try:
                await gen.__anext__()
                raise AssertionError("generate did not raise")
            except OverflowError:
                pass
            llm.engine_core.add_request_async = real_add
            assert len(sent) == 3
            # the three children the engine received were aborted: nothing runs, no KV held
            stats = await _settled(llm)
            assert stats.get("kv_cache_usage", 0.0) == 0.0
            assert "parent" not in llm._streams
            # and the engine serves the next request normally
            out = None
            async for out in llm.generate(ids, SamplingParams(n=2, max_tokens=3), "next"):
                pass
            assert out is not None and out.finished and all(len(c.token_ids) == 3 for c in out.outputs)
            await _settled(llm)
        finally:
            await llm.shutdown()

    asyncio.run(main())
