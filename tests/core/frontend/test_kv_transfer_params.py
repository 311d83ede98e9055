"""kv_transfer_params through the front end: a request's params reach every engine request of
its ``n`` samples, and the engine's answer on a final output lands on the prompt's result."""

from host.contracts.messages import EngineCoreOutput, EngineCoreRequest
from host.contracts.sampling_params import SamplingParams
from host.core.frontend.output_processor import OutputProcessor


def test_params_fan_out_and_the_answer_comes_back():
    processor = OutputProcessor(None)
    sent = {"do_remote_decode": True}
    request = EngineCoreRequest("r", [1, 2, 3], SamplingParams(n=2, max_tokens=1, detokenize=False), kv_transfer_params=sent)
    result, children = processor.add_request(request)
    assert [c.kv_transfer_params for c in children] == [sent, sent]
    assert result.kv_transfer_params is None
    answer = {"do_remote_prefill": True, "remote_block_ids": [4], "remote_port": 5601}
    processor.process_outputs([EngineCoreOutput(children[0].request_id, [7], "length", kv_transfer_params=answer),
                               EngineCoreOutput(children[1].request_id, [8], "length")])
    assert result.finished and result.kv_transfer_params == answer
