"""The sampler with the platform's Triton draw kernel plugged in (interpreted on CPU in CI):
greedy rows, logits processors, seeded rows and restrictions all flow through one launch."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")
from host.contracts.sampling_params import SamplingParams  # noqa: E402
from host.core.config import CompilationConfig  # noqa: E402
from host.core.worker.sampler import Sampler, make_metadata, seeded_generator  # noqa: E402
from host.plugins.builtin_cuda.platform import CudaPlatform  # noqa: E402
from host.plugins.triton_ops import sampling as triton_sampling  # noqa: E402

pytestmark = pytest.mark.triton
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def row(**kw):
    from host.core.worker.input_batch import CachedRequestState

    return CachedRequestState("r", [1, 2], SamplingParams(**kw), [], 2)


def test_mixed_batch_through_the_kernel():
    vocab = 64
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(0)).to(DEV)
    rows = [
        row(temperature=0.0),  # greedy
        row(temperature=1.0, top_k=1),  # top-1: the argmax too
        row(temperature=0.7, logit_bias={17: 100.0}),  # bias forces token 17
        row(temperature=1.0, top_k=5, top_p=0.8, seed=3),  # seeded
        row(temperature=1.0, allowed_token_ids=[40, 41]),  # whitelist
    ]
    sampler = Sampler(draw_kernel=triton_sampling.sample)

    def run():
        gens = {3: seeded_generator(hash((3, 0)))}
        return sampler(logits, make_metadata(rows, vocab, generators=gens)).sampled_token_ids.cpu().tolist()

    first = run()
    argmax = logits.argmax(-1).cpu().tolist()
    assert first[0] == argmax[0] and first[1] == argmax[1]
    assert first[2] == 17
    assert first[3] in logits[3].topk(5).indices.cpu().tolist()
    assert first[4] in (40, 41)
    assert run()[3] == first[3]  # the seeded row reproduces


def test_platform_offers_the_kernel_with_custom_ops():
    def config(level):
        c = CompilationConfig(level=level)
        c.resolve(8, True)
        return SimpleNamespace(compilation=c)

    assert CudaPlatform().sampling_kernel(config(2)) is triton_sampling.sample
    assert CudaPlatform().sampling_kernel(config(0)) is None
