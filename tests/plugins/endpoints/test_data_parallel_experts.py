"""``host serve -dp 2 --enable-expert-parallel``: a tiny Qwen3-MoE whose experts are split over two
engine-core processes that step together, through the official openai client. Concurrent
requests (some streamed, spread over both engines, then one alone so the other engine only runs
dummy forwards) each get transformers' greedy tokens for their prompt; the server stops
cleanly."""

from __future__ import annotations

import asyncio

import openai

from helpers import hf_greedy, hf_model, run_server, tiny_moe

PROMPTS = [f"Note {i}: the {'small ' * (i % 3)}expert number {i * 3} said" for i in range(6)]
N_TOKENS = 8


def test_experts_split_over_two_engines_serve_transformers_tokens(tmp_path_factory) -> None:
    import transformers

    from host.core.models.default_model import resolve_model_path

    model = tiny_moe(tmp_path_factory.mktemp("moe"), "qwen3_moe", seed=5, vocab_size=49152)
    tokenizer = resolve_model_path("default")
    args = ["--model", model, "--tokenizer", tokenizer, "-dp", "2", "--enable-expert-parallel", "--max-model-len", "256",
            "--kv-cache-memory", "16MiB"]
    with run_server(tmp_path_factory.mktemp("dp_ep"), args) as server:
        log = server.log()
        assert "physical experts 0-3 of 8" in log and "physical experts 4-7 of 8" in log, log
        extra = {"return_token_ids": True, "ignore_eos": True}

        async def one(client: openai.AsyncOpenAI, prompt: str, stream: bool) -> tuple[list[int], list[int]]:
            kw = dict(model=model, prompt=prompt, max_tokens=N_TOKENS, temperature=0.0, extra_body=extra)
            if not stream:
                choice = (await client.completions.create(**kw)).choices[0]
                return choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
            ids, prompt_ids = [], None
            async for chunk in await client.completions.create(stream=True, **kw):
                ids += chunk.choices[0].model_extra.get("token_ids") or []
                prompt_ids = chunk.choices[0].model_extra.get("prompt_token_ids") or prompt_ids
            return prompt_ids, ids

        async def run() -> list:
            client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            try:
                together = await asyncio.gather(*(one(client, p, i % 2 == 0) for i, p in enumerate(PROMPTS[:-1])))
                return [*together, await one(client, PROMPTS[-1], False)]
            finally:
                await client.close()

        results = asyncio.run(run())
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    hf = hf_model(model)
    for prompt, (prompt_ids, ids) in zip(PROMPTS, results):
        assert prompt_ids == tok(prompt).input_ids
        assert ids == hf_greedy(hf, prompt_ids, N_TOKENS), prompt
