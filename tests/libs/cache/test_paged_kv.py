"""The block copy path: blocks read into one host buffer and written into other blocks."""

from __future__ import annotations

import pytest
import torch

from quire.cache.paged_kv import PagedKVCache, kv_bytes_per_block, kv_bytes_per_token
from quire.model.model_config import ModelConfig


def gqa_config() -> ModelConfig:
    """3 layers, 4 query heads over 2 KV heads of 16 dims (grouped-query attention)."""
    from transformers import LlamaConfig

    hf = LlamaConfig(
        architectures=["LlamaForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=256,
    )
    return ModelConfig.from_hf(hf)


def filled_cache(dtype: torch.dtype, num_blocks: int = 10) -> PagedKVCache:
    kv = PagedKVCache(gqa_config(), num_blocks, 4, dtype, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for k, v in kv.layers:
        k.copy_(torch.randn(k.shape, generator=generator).to(dtype))
        v.copy_(torch.randn(v.shape, generator=generator).to(dtype))
    return kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_read_then_write_makes_the_blocks_equal(dtype: torch.dtype) -> None:
    kv = filled_cache(dtype)
    src, dst = [7, 2, 5], [0, 9, 3]
    buffer = kv.read_blocks(src)
    # One contiguous span per block: every layer's keys and values, in that order.
    assert buffer.shape == (3, 3, 2, 4, 2, 16) and buffer.is_contiguous()
    assert buffer.dtype == dtype and buffer.device.type == "cpu"
    assert buffer[0].numel() * buffer.element_size() == kv.bytes_per_block
    assert kv.bytes_per_block == kv_bytes_per_block(gqa_config(), 4, dtype)
    untouched = [b for b in range(10) if b not in dst]
    before = [(k[untouched].clone(), v[untouched].clone()) for k, v in kv.layers]
    kv.write_blocks(dst, buffer)
    for layer, (k, v) in enumerate(kv.layers):
        for s, d in zip(src, dst, strict=True):
            assert torch.equal(k[d].view(torch.uint8), k[s].view(torch.uint8))
            assert torch.equal(v[d].view(torch.uint8), v[s].view(torch.uint8))
            assert torch.equal(buffer[src.index(s), layer, 0], k[s])
        assert torch.equal(k[untouched], before[layer][0])
        assert torch.equal(v[untouched], before[layer][1])


def test_the_buffer_is_a_copy() -> None:
    kv = filled_cache(torch.float32)
    buffer = kv.read_blocks([1])
    kept = buffer.clone()
    kv.copy_blocks([(2, 1)])  # the block changes on the device; the buffer does not
    assert torch.equal(buffer, kept)
    assert torch.equal(kv.layers[0][0][1], kv.layers[0][0][2])


def test_bad_ids_and_buffers_are_refused() -> None:
    kv = filled_cache(torch.float32)
    with pytest.raises(ValueError, match="outside the pool"):
        kv.read_blocks([10])
    buffer = kv.read_blocks([1, 2])
    with pytest.raises(ValueError, match="buffer"):
        kv.write_blocks([1], buffer)
    with pytest.raises(ValueError, match="buffer"):
        kv.write_blocks([1, 2], buffer.to(torch.bfloat16))
    kv.write_blocks([], kv.read_blocks([]))  # nothing to move is fine


def mla_config() -> ModelConfig:
    """2 layers of DeepSeek-V2's latent attention: 4 heads, one cached 24 + 8 = 32-wide latent."""
    from transformers import DeepseekV2Config

    hf = DeepseekV2Config(
        architectures=["DeepseekV2ForCausalLM"],
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        kv_lora_rank=24,
        q_lora_rank=None,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        vocab_size=100,
        max_position_embeddings=256,
    )
    return ModelConfig.from_hf(hf)


def test_an_mla_layer_caches_one_latent_plane() -> None:
    config = mla_config()
    kv = PagedKVCache(config, 6, 4, torch.float32, torch.device("cpu"))
    assert kv_bytes_per_token(config, torch.float32) == 2 * 32 * 4  # not 2 x 4 heads x (K + V)
    assert kv.bytes_per_block == 4 * 2 * 32 * 4
    assert [tuple(c.shape for c in planes) for planes in kv.layers] == [((6, 4, 1, 32),)] * 2
    generator = torch.Generator().manual_seed(1)
    for (latent,) in kv.layers:
        latent.copy_(torch.randn(latent.shape, generator=generator))
    buffer = kv.read_blocks([4, 1])
    assert buffer.shape == (2, 2, 1, 4, 1, 32) and buffer[0].numel() * 4 == kv.bytes_per_block
    kv.write_blocks([0, 5], buffer)
    kv.copy_blocks([(4, 2)])
    for layer, (latent,) in enumerate(kv.layers):
        assert torch.equal(latent[0], latent[4]) and torch.equal(latent[5], latent[1])
        assert torch.equal(latent[2], latent[4])
        assert torch.equal(buffer[0, layer, 0], latent[4])
