"""Tensor-parallel layers and pipeline stages in ONE process (no collectives).

Each tensor-parallel rank's layer is built with an explicit ``tp_rank`` / ``tp_size`` and fed the
FULL checkpoint tensors; the ranks' outputs, combined as the collectives would (summed for the
row-parallel and embedding layers, concatenated for the column-parallel and LM-head layers), must
equal the unsharded ``nn.Linear`` / ``nn.Embedding``. Pipeline stages: two stage models loaded
from one checkpoint, chained by hand, against Hugging Face logits. The real collectives run in
``test_tensor_parallel.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from helpers import hf_model
from host.core.models.gguf_file import GGUFTensor
from host.core.models.llama import LlamaForCausalLM
from host.core.models.loader import iter_hf_weights
from host.core.models.parallel_layers import (
    ColumnParallelLinear,
    ModelShard,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_tp_shardable,
    column_linear,
    qkv_shard_rows,
    slice_columns,
    valid_tp_sizes,
)
from host.core.models.pipeline import MissingLayer, partition_layers
from host.core.models.quant_linear import QuantLinear
from host.core.models.registry import resolve_model_class

torch.manual_seed(0)
HIDDEN, HEAD_DIM = 32, 8


def _full_linear(out: int, inp: int, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(inp, out, bias=bias)
    with torch.no_grad():
        layer.weight.normal_()
        if bias:
            layer.bias.normal_()
    return layer


@pytest.mark.parametrize("heads,kv_heads,tp", [(4, 2, 2), (4, 1, 2), (8, 2, 4), (8, 4, 2)])
def test_qkv_column_parallel_gives_each_rank_its_heads_and_their_kv_heads(heads: int, kv_heads: int, tp: int) -> None:
    q, k, v = (_full_linear(n * HEAD_DIM, HIDDEN) for n in (heads, kv_heads, kv_heads))
    x = torch.randn(5, HIDDEN)
    full_q, full_k, full_v = (m(x).view(5, -1, HEAD_DIM) for m in (q, k, v))
    group = heads // kv_heads  # q heads per kv head
    for rank in range(tp):
        rows = qkv_shard_rows(heads, kv_heads, HEAD_DIM, rank, tp)
        layer = ColumnParallelLinear(
            None, "qkv", HIDDEN, [heads * HEAD_DIM, kv_heads * HEAD_DIM, kv_heads * HEAD_DIM], True, torch.float32,
            shard_rows=rows, tp_rank=rank, tp_size=tp,
        )
        for shard, full in enumerate((q, k, v)):
            layer.load_checkpoint("weight", shard, full.weight.data)
            layer.load_checkpoint("bias", shard, full.bias.data)
        local_q, local_k, local_v = layer(x).split(layer.output_sizes, dim=-1)
        local_q, local_k, local_v = (t.reshape(5, -1, HEAD_DIM) for t in (local_q, local_k, local_v))
        my_heads = list(range(rank * heads // tp, (rank + 1) * heads // tp))
        torch.testing.assert_close(local_q, full_q[:, my_heads], rtol=1e-5, atol=1e-5)
        # every q head of this rank finds the kv head it attends with (GQA grouping) locally
        local_kv_per_q = local_k.shape[1]
        for i, h in enumerate(my_heads):
            kv_local = i * local_kv_per_q // len(my_heads)
            torch.testing.assert_close(local_k[:, kv_local], full_k[:, h // group], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(local_v[:, kv_local], full_v[:, h // group], rtol=1e-5, atol=1e-5)
        assert local_k.shape[1] == max(kv_heads // tp, 1)


def test_gate_up_column_and_down_row_parallel_recompose_the_mlp() -> None:
    inter, tp = 48, 3
    gate, up, down = _full_linear(inter, HIDDEN), _full_linear(inter, HIDDEN), _full_linear(HIDDEN, inter)
    x = torch.randn(4, HIDDEN)
    expected = down(torch.nn.functional.silu(gate(x)) * up(x))
    partials = []
    for rank in range(tp):
        gate_up = ColumnParallelLinear(None, "gate_up", HIDDEN, [inter, inter], True, torch.float32, tp_rank=rank, tp_size=tp)
        for shard, full in enumerate((gate, up)):
            gate_up.load_checkpoint("weight", shard, full.weight.data)
            gate_up.load_checkpoint("bias", shard, full.bias.data)
        row = RowParallelLinear(None, "down", inter, HIDDEN, True, torch.float32, tp_rank=rank, tp_size=tp)
        row.load_checkpoint("weight", 0, down.weight.data)
        row.load_checkpoint("bias", 0, down.bias.data)
        g, u = gate_up(x).chunk(2, dim=-1)
        partials.append(row.linear(torch.nn.functional.silu(g) * u))  # this rank's part, before the all-reduce
        assert row.linear.bias is None  # the bias is added once, after the reduce
    # three partial sums add in another order than one matmul: fp32 rounding of ~1e-5 (a wrong shard is off by ~1)
    torch.testing.assert_close(sum(partials) + row.bias, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vocab,tp", [(301, 2), (301, 4), (300, 3)])
def test_vocab_parallel_embedding_and_lm_head_cover_the_vocabulary(vocab: int, tp: int) -> None:
    table = torch.randn(vocab, HIDDEN)
    head = torch.randn(vocab, HIDDEN)
    ids = torch.tensor([0, 1, vocab // 2, vocab - 2, vocab - 1, 75, 76, 151])
    hidden = torch.randn(3, HIDDEN)
    embedded, logits = 0, []
    for rank in range(tp):
        emb = VocabParallelEmbedding(None, "embed", vocab, HIDDEN, torch.float32, tp_rank=rank, tp_size=tp)
        emb.load_checkpoint("weight", 0, table)
        embedded = embedded + emb.local_embed(ids)
        lm = ParallelLMHead(None, "lm_head", HIDDEN, vocab, torch.float32, tp_rank=rank, tp_size=tp)
        lm.load_checkpoint("weight", 0, head)
        local = lm.local_logits(hidden)
        assert lm.per_rank == -(-vocab // tp) and local.shape[-1] <= lm.per_rank
        logits.append(local)
        torch.testing.assert_close(emb.local_logits(hidden), hidden @ table[emb.vocab_start : emb.vocab_end].T)
    torch.testing.assert_close(embedded, table[ids], rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(logits, dim=-1), hidden @ head.T, rtol=1e-5, atol=1e-5)


def test_tp1_factories_build_todays_plain_modules() -> None:
    layer = column_linear(None, "x", HIDDEN, [16, 8], True, torch.float32, tp_rank=0, tp_size=1)
    assert type(layer) is nn.Linear and layer.out_features == 24


def _gguf(weight: torch.Tensor, qtype_name: str) -> GGUFTensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[qtype_name]
    data = quantize(weight.numpy().astype(np.float32), qtype)
    return GGUFTensor(torch.from_numpy(np.ascontiguousarray(data)), int(qtype), tuple(weight.shape))


def test_gguf_block_tensors_slice_rows_and_block_aligned_columns() -> None:
    weight = torch.randn(6, 128)
    blocks = _gguf(weight, "Q8_0")  # 32-column blocks
    full = blocks.dequantize(torch.float32)
    aligned = slice_columns(blocks, slice(64, 128), "down", torch.float32)
    assert isinstance(aligned, GGUFTensor) and aligned.shape == (6, 64)
    torch.testing.assert_close(aligned.dequantize(torch.float32), full[:, 64:], rtol=0, atol=0)
    inside = slice_columns(blocks, slice(16, 80), "down", torch.float32)  # cuts blocks: dequantized
    assert isinstance(inside, torch.Tensor)
    torch.testing.assert_close(inside, full[:, 16:80], rtol=0, atol=0)
    # a row-parallel layer fed the blocks computes the same partial product as the dequantized slice
    x = torch.randn(2, 64)
    row = RowParallelLinear(None, "down", 128, 6, False, torch.float32, tp_rank=1, tp_size=2)
    row.load_checkpoint("weight", 0, blocks)
    torch.testing.assert_close(row.linear(x), x @ full[:, 64:].T, rtol=1e-5, atol=1e-5)


def test_int8_column_parallel_quantizes_this_ranks_rows() -> None:
    from host.plugins.quantization.int8 import Int8LinearMethod

    full = _full_linear(16, HIDDEN, bias=False)
    x = torch.randn(3, HIDDEN)
    outs = []
    for rank in range(2):
        layer = ColumnParallelLinear(lambda name: Int8LinearMethod(), "proj", HIDDEN, [16], False, torch.float32, tp_rank=rank, tp_size=2)
        layer.load_checkpoint("weight", 0, full.weight.data)
        layer.linear.method.process_weights_after_loading(layer.linear)
        assert layer.linear.qweight.shape == (8, HIDDEN)
        outs.append(layer(x))
    whole = QuantLinear("proj", HIDDEN, [16], False, torch.float32, Int8LinearMethod())  # the unsharded int8 layer
    whole.load_shard(0, full.weight.data)
    whole.method.process_weights_after_loading(whole)
    torch.testing.assert_close(torch.cat(outs, dim=-1), whole(x), rtol=1e-5, atol=1e-5)


SMOLLM2_135M = dict(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, num_hidden_layers=30)


def test_unshardable_config_names_the_sizes_that_work() -> None:
    with pytest.raises(ValueError, match=r"^-tp 2 cannot split 9 attention heads; use -tp 1 or 3$"):
        check_tp_shardable(9, 3, 1536, 2)
    assert valid_tp_sizes(32, 8, 11008) == [1, 2, 4, 8, 16, 32]  # kv heads replicated above 8
    with pytest.raises(ValueError, match="cannot split 3 key-value heads"):
        check_tp_shardable(12, 3, 48, 2)
    config = transformers.LlamaConfig(**SMOLLM2_135M)
    with pytest.raises(ValueError, match="-tp 2 cannot split 9 attention heads; use -tp 1 or 3"):
        LlamaForCausalLM(config, shard=ModelShard(tp_rank=0, tp_size=2))


def test_pipeline_partition() -> None:
    assert partition_layers(30, 1) == [(0, 30)]
    assert partition_layers(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]  # extras to the first stages
    assert partition_layers(10, 2, [3, 7]) == [(0, 3), (3, 10)]
    with pytest.raises(ValueError, match=r"--pp-layer-partition 3,3 must give 2 positive layer counts summing to the model's 10"):
        partition_layers(10, 2, [3, 3])
    with pytest.raises(ValueError, match="-pp 3 needs at least one decoder layer per stage"):
        partition_layers(2, 3)


@pytest.mark.parametrize("tied", [True, False])
def test_pipeline_stages_skip_what_they_do_not_hold_and_chain_to_hf_logits(tiny_checkpoint, tied: bool) -> None:
    path = tiny_checkpoint("qwen3", num_hidden_layers=3, tie_word_embeddings=tied, norm_std=0.1)
    config = transformers.AutoConfig.from_pretrained(path)
    cls = resolve_model_class(config.architectures)
    stages = [cls(config, torch.float32, None, shard=ModelShard(pp_rank=r, pp_size=2, pp_layer_partition=[1, 2])) for r in range(2)]
    loaded = [stage.load_weights(iter_hf_weights(str(path))) for stage in stages]
    first, last = stages
    assert (first.start_layer, first.end_layer, last.start_layer, last.end_layer) == (0, 1, 1, 3)
    assert first.is_first_stage and not first.is_last_stage and last.is_last_stage and not last.is_first_stage
    assert isinstance(first.model.layers[1], MissingLayer) and isinstance(last.model.layers[0], MissingLayer)
    assert first.model.norm is None and first.lm_head is None and last.model.embed_tokens is None
    assert not any(".layers.1." in n or ".layers.2." in n or n.startswith(("lm_head", "model.norm")) for n in loaded[0])
    assert not any(".layers.0." in n or "embed_tokens" in n for n in loaded[1]) and "lm_head.weight" in loaded[1]
    assert last.model.layers[2].self_attn.attn.layer_idx == 2  # global layer indices
    ids = torch.tensor([3, 17, 5, 250, 9, 42, 7])
    positions = torch.arange(len(ids))
    with torch.no_grad():
        handoff = first(ids, positions)
        assert set(handoff) == {"hidden", "residual"}
        logits = last.compute_logits(last(ids, positions, intermediate=handoff))
        reference = hf_model(path)(ids[None]).logits[0]
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)


def test_engine_args_refuse_an_unsplittable_model_before_workers_start(tiny_checkpoint) -> None:
    from host.core.engine_args import EngineArgs

    path = str(tiny_checkpoint("llama", weights=False, hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=144))
    with pytest.raises(ValueError, match=r"^-tp 2 cannot split 9 attention heads; use -tp 1, 3 or 9$"):
        EngineArgs(model=path, skip_tokenizer_init=True, tensor_parallel_size=2).create_engine_config()
    with pytest.raises(ValueError, match="--pp-layer-partition 1,2 must give 2 positive layer counts summing to the model's 2"):
        EngineArgs(model=path, skip_tokenizer_init=True, pipeline_parallel_size=2, pp_layer_partition=[1, 2]).create_engine_config()
    EngineArgs(model=path, skip_tokenizer_init=True, tensor_parallel_size=3).create_engine_config()  # 3 works
