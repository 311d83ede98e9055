"""json_schema_extract: the payload checks, the sampling parameters it derives (greedy, the
schema as the structured-output constraint), the prompt, the parsed answer, and the suite.
(Through a server and the engine: tests/plugins/endpoints/test_embeddings.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from host.plugins import io_processors
from host.plugins.io_processors.json_schema_extract import JSONSchemaExtractProcessor
from host.sdk.testing import IOProcessorConformance

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _out(text, finish="stop"):
    return SimpleNamespace(outputs=[SimpleNamespace(text=text, finish_reason=finish)])


def test_sampling_params_constrain_to_the_schema():
    proc = JSONSchemaExtractProcessor()
    data = proc.parse_data({"text": "I live in Paris.", "schema": SCHEMA, "max_tokens": 40})
    params = proc.merge_sampling_params(None, data)
    assert params.temperature == 0.0 and params.max_tokens == 40
    assert params.structured_outputs.json == SCHEMA
    prompt = proc.pre_process(data, request_id="r")
    assert "I live in Paris." in prompt and json.dumps(SCHEMA) in prompt


def test_the_answer_is_parsed_and_a_cut_answer_names_max_tokens():
    proc = JSONSchemaExtractProcessor()
    assert proc.post_process([_out('{"city": "Paris"}')])["data"] == {"city": "Paris"}
    with pytest.raises(ValueError, match="max_tokens"):
        proc.post_process([_out('{"city": "Pa', "length")])


@pytest.mark.parametrize("payload, match", [
    ([], "must be an object"),
    ({"schema": SCHEMA}, '"text" must be'),
    ({"text": "x"}, '"schema" must be'),
    ({"text": "x", "schema": "string"}, '"schema" must be'),
    ({"text": "x", "schema": SCHEMA, "max_tokens": 0}, "max_tokens=0"),
    ({"text": "x", "schema": SCHEMA, "instruction": 3}, '"instruction" must be'),
    ({"text": "x", "schema": SCHEMA, "format": "json"}, "unknown field"),
])
def test_bad_payloads_name_the_field(payload, match):
    with pytest.raises(ValueError, match=match):
        JSONSchemaExtractProcessor().parse_data(payload)


class TestJSONSchemaExtractConformance(IOProcessorConformance):
    processor = JSONSchemaExtractProcessor
    plugin_module = io_processors
    payload = {"text": "Ada lives in London.", "schema": SCHEMA}
    bad_payloads = [None, {"text": "x"}, {"schema": SCHEMA}, {"text": "x", "schema": {}}]

    def model_outputs(self, prompts):
        return [_out('{"city": "London"}') for _ in prompts]
