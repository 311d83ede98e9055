"""The model-architecture suite: a natively served architecture against transformers.

It builds a tiny random checkpoint of the architecture with transformers (``config()``, then
``reference_model(config)`` and ``save_pretrained``; ``config.json`` names ``architecture``),
and checks host's implementation of it:

- the registration (``plugin_module`` registers ``architecture`` in the ``models`` registry);
- the model alone (no engine: plain causal attention) gives transformers' logits within
  ``logits_atol``;
- an engine on it, with prefix caching and chunked prefill on (a step budget smaller than the
  prompts, prompts sharing a prefix, generated twice so the second pass hits the cache), gives
  transformers' greedy tokens and their logprobs within ``logprob_atol``, and frees every block;
- when the class declares ``supports_tensor_parallel``, the same tokens under ``-tp 2`` (worker
  processes load plugins from entry points, so this needs the plugin installed).
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Iterator

from host.sdk.conformance import tiny_model
from host.sdk.conformance.base import RegistrationCheck

_CHECKPOINTS: dict[type, tuple[str, Any]] = {}


class ModelConformance(RegistrationCheck):
    """Set ``architecture`` (the name the plugin registers) and ``config()`` (a tiny transformers
    config of it: a few layers, hidden size 64, a vocabulary of a few hundred). Optional:
    ``plugin_module`` (registered for the test when the architecture is not installed),
    ``reference_model(config)`` (default ``AutoModelForCausalLM.from_config``), ``engine_args``
    (extra ``LLM`` arguments), ``logits_atol`` / ``logprob_atol`` (1e-4, float32),
    ``tensor_parallel_size`` (2; 0 skips the tensor-parallel check)."""

    architecture: ClassVar[str] = ""
    engine_args: ClassVar[dict[str, Any]] = {}
    logits_atol: ClassVar[float] = 1e-4
    logprob_atol: ClassVar[float] = 1e-4
    tensor_parallel_size: ClassVar[int] = 2
    max_tokens: ClassVar[int] = 6
    registry_kind = "models"
    group = "host.models"

    def registered_name(self) -> str:
        return self.architecture

    def config(self) -> Any:
        raise NotImplementedError("return a tiny transformers config of the architecture from config()")

    def reference_model(self, config: Any) -> Any:
        import transformers

        return transformers.AutoModelForCausalLM.from_config(config)

    # -- the checkpoint and the reference ------------------------------------------------------

    def checkpoint(self) -> tuple[str, Any]:
        """``(directory, reference model)``, made once per suite class (seed 0, float32)."""
        if type(self) not in _CHECKPOINTS:
            import torch

            assert self.architecture, "set `architecture` to the name your plugin registers"
            state = torch.random.get_rng_state()
            torch.manual_seed(0)
            reference = self.reference_model(self.config()).float().eval()
            torch.random.set_rng_state(state)
            path = Path(tempfile.mkdtemp(prefix="host-model-conformance-")) / self.architecture
            reference.save_pretrained(path)
            config = json.loads((path / "config.json").read_text())
            config["architectures"] = [self.architecture]
            (path / "config.json").write_text(json.dumps(config, indent=2))
            _CHECKPOINTS[type(self)] = (str(path), reference)
        return _CHECKPOINTS[type(self)]

    @contextlib.contextmanager
    def served(self) -> Iterator[None]:
        """The architecture registered in this process for the block (installed, or
        ``plugin_module`` registered in memory)."""
        from host.core.models.registry import supported_architectures

        if self.architecture in supported_architectures() or self.plugin_module is None:
            yield
            return
        from host.sdk.testing import registered_plugin

        with registered_plugin(self.plugin_module, name=f"conformance-{self.architecture}", group=self.group):
            yield

    def prompts(self) -> list[list[int]]:
        """Four prompts longer than the step budget; three share a 20-token prefix."""
        vocab = int(self.config().vocab_size)
        rng = random.Random(11)
        prefix = [rng.randrange(3, vocab) for _ in range(20)]
        tails = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 13, 21)]
        return [prefix + t for t in tails] + [[rng.randrange(3, vocab) for _ in range(27)]]

    def reference_greedy(self, prompt_ids: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """transformers' greedy tokens of each prompt and each token's logprob."""
        import torch

        _, reference = self.checkpoint()
        out = []
        with torch.inference_mode():
            for p in prompt_ids:
                ids = reference.generate(torch.tensor([p]), max_new_tokens=self.max_tokens,
                                         min_new_tokens=self.max_tokens, do_sample=False)[0]
                logits = reference(ids[None]).logits[0].float()
                logprobs = torch.log_softmax(logits, dim=-1)
                tokens = ids[len(p):].tolist()
                out.append((tokens, [logprobs[len(p) - 1 + i, t].item() for i, t in enumerate(tokens)]))
        return out

    def engine(self, **overrides: Any) -> Any:
        from host import LLM

        path, _ = self.checkpoint()
        args = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=96, max_num_batched_tokens=16,
                    max_num_seqs=4, block_size=8, enable_prefix_caching=True, enable_chunked_prefill=True)
        return LLM(path, **{**args, **self.engine_args, **overrides})

    @staticmethod
    def run(llm: Any, prompt_ids: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        from host.sdk.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=1)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params)
        got = []
        for o in outs:
            c = o.outputs[0]
            got.append((list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]))
        return got

    # -- the checks ----------------------------------------------------------------------------

    def test_the_model_alone_gives_transformers_logits(self) -> None:
        import torch

        from host.core.config import LoadConfig, ModelConfig
        from host.core.models.loader import load_model

        path, reference = self.checkpoint()
        ids = torch.tensor(self.prompts()[2])
        with self.served():
            model, _ = load_model(ModelConfig(model=path, dtype="float32"), LoadConfig(), None)
        with torch.inference_mode():
            want = reference(ids[None]).logits[0].float()
            got = model.compute_logits(model(ids, torch.arange(len(ids))))
        diff = (got - want).abs().max().item()
        assert diff <= self.logits_atol, (
            f"{self.architecture}: logits differ from transformers' by {diff:.3g} (> {self.logits_atol})"
        )

    def test_an_engine_matches_transformers_with_prefix_caching_and_chunked_prefill(self) -> None:
        ps = self.prompts()
        want = self.reference_greedy(ps)
        with self.served():
            llm = self.engine()
            try:
                first = self.run(llm, ps, self.max_tokens)
                again = self.run(llm, ps, self.max_tokens)  # the prompts' blocks are cached now
                stats = llm.engine.kv_cache_manager.prefix_cache_stats
                hits = stats.hits
                tiny_model.no_leaked_blocks(llm)
            finally:
                llm.shutdown()
        for label, got in (("first pass", first), ("cached pass", again)):
            for i, ((tokens, lps), (want_tokens, want_lps)) in enumerate(zip(got, want)):
                assert tokens == want_tokens, f"{self.architecture} {label}, prompt {i}: {tokens} != transformers' {want_tokens}"
                worst = max(abs(a - b) for a, b in zip(lps, want_lps))
                assert worst <= self.logprob_atol, f"{self.architecture} {label}, prompt {i}: logprobs off by {worst:.3g}"
        assert hits > 0, "the second pass found nothing in the prefix cache"

    def test_tensor_parallel_gives_the_same_tokens(self) -> None:
        import pytest

        from host.core.models.registry import resolve_model_class

        if self.tensor_parallel_size < 2:
            pytest.skip("tensor_parallel_size < 2: no tensor-parallel check")
        with self.served():
            model_cls = resolve_model_class([self.architecture])
        if not getattr(model_cls, "supports_tensor_parallel", False):
            pytest.skip(f"{model_cls.__name__} does not declare supports_tensor_parallel")
        from host.core.models.registry import supported_architectures

        if self.architecture not in supported_architectures():
            pytest.skip("the tensor-parallel check needs the plugin installed (worker processes load it from its entry point)")
        ps = self.prompts()[:2]
        want = [tokens for tokens, _ in self.reference_greedy(ps)]
        llm = self.engine(tensor_parallel_size=self.tensor_parallel_size, distributed_executor_backend="mp")
        try:
            got = [tokens for tokens, _ in self.run(llm, ps, self.max_tokens)]
        finally:
            llm.shutdown()
        assert got == want, f"{self.architecture} with -tp {self.tensor_parallel_size}: {got} != transformers' {want}"
