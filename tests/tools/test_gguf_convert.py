"""GGUF conversion on a tiny synthetic llama GGUF, against transformers' own GGUF loader."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from quire_tools import gguf_convert
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

from quire.model import gguf_checkpoint
from quire.model.model_config import ModelConfig

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Where each llama.cpp tensor is stored quantized: a mix of what real GGUFs carry.
QUANT = {
    "attn_q": QType.Q4_1,
    "attn_k": QType.Q4_1,
    "attn_v": QType.F16,
    "attn_output": QType.Q4_1,
    "ffn_gate": QType.Q4_1,
    "ffn_up": QType.Q8_0,
    "ffn_down": QType.Q4_1,
}


def _tokens() -> list[str]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    return SPECIALS + alphabet + ["".join(m.split()) for m in MERGES]


def _llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    # What llama.cpp's convert_hf_to_gguf.py does to q/k rows (LlamaModel.permute).
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _hf_weights(vocab: int, tied: bool) -> dict[str, np.ndarray]:
    """Random float32 weights in Hugging Face layout (the 'source model' of the GGUF)."""
    rng = np.random.default_rng(0)

    def w(*shape: int, std: float = 0.2) -> np.ndarray:
        return rng.normal(0.0, std, shape).astype(np.float32)

    weights = {"model.embed_tokens.weight": w(vocab, HIDDEN, std=1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        weights |= {
            f"{p}.input_layernorm.weight": 1 + w(HIDDEN, std=0.1),
            f"{p}.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{p}.self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
            f"{p}.post_attention_layernorm.weight": 1 + w(HIDDEN, std=0.1),
            f"{p}.mlp.gate_proj.weight": w(INTER, HIDDEN),
            f"{p}.mlp.up_proj.weight": w(INTER, HIDDEN),
            f"{p}.mlp.down_proj.weight": w(HIDDEN, INTER),
        }
    weights["model.norm.weight"] = 1 + w(HIDDEN, std=0.1)
    if not tied:
        weights["lm_head.weight"] = w(vocab, HIDDEN)
    return weights


def write_tiny_gguf(path: Path, tied: bool = True) -> dict[str, np.ndarray]:
    """Write a tiny llama GGUF the way llama.cpp's converter would; return its source weights."""
    tokens = _tokens()
    hf = _hf_weights(len(tokens), tied)
    to_gguf = {v: k for k, v in gguf_checkpoint.GLOBAL_TENSORS.items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny synthetic llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, weight in hf.items():
        if name in to_gguf:
            gguf_name, qtype = to_gguf[name], QType.Q8_0 if "embed" in name else QType.F32
        else:
            layer, hf_short = name.split(".")[2], ".".join(name.split(".")[3:-1])
            short = {v: k for k, v in gguf_checkpoint.LAYER_TENSORS.items()}[hf_short]
            gguf_name, qtype = f"blk.{layer}.{short}.weight", QUANT.get(short, QType.F32)
            if short in ("attn_q", "attn_k"):
                weight = _llama_cpp_permute(weight, HEADS if short == "attn_q" else KV_HEADS)
        data = gguf.quants.quantize(weight, qtype)
        if qtype in (QType.F32, QType.F16):
            writer.add_tensor(gguf_name, data)
        else:
            writer.add_tensor(gguf_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("gguf")
    source = write_tiny_gguf(root / "tiny.gguf", tied=request.param)
    out = gguf_convert.write_checkpoint(root / "tiny.gguf", root / "hf", {"gguf": "tiny.gguf"})
    return root / "tiny.gguf", out, source


def test_logits_match_transformers_gguf_loader(
    converted: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    gguf_path, out, _ = converted
    ours = AutoModelForCausalLM.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    assert ours.dtype == torch.float32
    ours_state, ref_state = ours.state_dict(), reference.state_dict()
    assert ours_state.keys() == ref_state.keys()
    for name, tensor in ours_state.items():
        assert torch.equal(tensor, ref_state[name]), name
    ids = torch.tensor([[1, 40, 70, 90, 100, 200, 260, 262, 5, 7]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, reference(ids).logits, rtol=0, atol=0)


def test_weights_are_exact_dequantization_with_permutation_undone(
    converted: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    gguf_path, out, source = converted
    state = AutoModelForCausalLM.from_pretrained(out).state_dict()
    reader = gguf.GGUFReader(gguf_path)
    by_name = {gguf_convert.hf_tensor_name(t.name): t for t in reader.tensors}
    for name, tensor in by_name.items():
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(
            state[name].shape
        )
        if ".q_proj." in name or ".k_proj." in name:
            expected = gguf_convert.unpermute_rows(
                expected, HEADS if ".q_proj." in name else KV_HEADS
            )
        assert torch.equal(state[name], torch.from_numpy(np.array(expected))), name
        if tensor.tensor_type == QType.F32:
            assert torch.equal(state[name], torch.from_numpy(source[name])), name
    # Q4_1 keeps each weight within about half a step (range / 30) of the source; the rows
    # still in llama.cpp's order would be off by the weights' own size.
    q = "model.layers.1.self_attn.q_proj.weight"
    error = (state[q] - torch.from_numpy(source[q])).abs().max().item()
    still_permuted = torch.from_numpy(_llama_cpp_permute(source[q], HEADS))
    assert error < 0.1 < (state[q] - still_permuted).abs().max().item()


def test_config_tokenizer_and_eos(converted: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    _, out, source = converted
    tied = "lm_head.weight" not in source
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied
    assert (config["rms_norm_eps"], config["head_dim"], config["dtype"]) == (1e-5, 16, "float32")
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]  # <|im_end|>, then <|endoftext|>
    model_config = ModelConfig.from_pretrained(out)
    assert (model_config.num_heads, model_config.num_kv_heads, model_config.num_layers) == (4, 2, 2)
    assert model_config.tie_word_embeddings is tied

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == len(_tokens())
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "in the hat"}])["input_ids"]
    assert tokenizer.decode(ids) == "<|im_start|>user\nin the hat<|im_end|>\n"
    assert ids[0] == 1 and ids.count(2) == 1
    assert tokenizer.convert_tokens_to_ids("Ġthe") in ids  # merges applied


def test_conversion_is_byte_identical(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf")
    source = {"gguf": "tiny.gguf"}  # what main() records for a local file
    first = gguf_convert.write_checkpoint(tmp_path / "tiny.gguf", tmp_path / "a", source)
    gguf_convert.main(["--gguf", str(tmp_path / "tiny.gguf"), "--out", str(tmp_path / "b")])
    files = sorted(p.name for p in first.iterdir())
    assert "model.safetensors" in files and gguf_convert.MANIFEST in files
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert (first / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    manifest = json.loads((first / gguf_convert.MANIFEST).read_text())
    assert set(manifest["files"]) == set(files) - {gguf_convert.MANIFEST}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs left behind"


def test_unknown_tensors_and_architectures_are_refused(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "qwen2.gguf"), "qwen2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'qwen2' is not supported"):
        gguf_convert.build_config(gguf.GGUFReader(tmp_path / "qwen2.gguf"))
    assert gguf_convert.hf_tensor_name("blk.3.ffn_up.weight") == "model.layers.3.mlp.up_proj.weight"
    with pytest.raises(ValueError, match="no Hugging Face Llama equivalent"):
        gguf_convert.hf_tensor_name("blk.0.attn_q.bias")
    with pytest.raises(ValueError, match="no Hugging Face Llama equivalent"):
        gguf_convert.hf_tensor_name("rope_freqs.weight")
