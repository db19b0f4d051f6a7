from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from quire_tools import make_model
from quire_tools.make_model import BOS_ID, EOS_ID, IM_END_ID, IM_START_ID, PAD_ID, VOCAB_SIZE
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

TEST_PRESETS = [
    "tiny",
    "tiny-mqa",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-qwen3",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-phi3",
    "tiny-phi3-longrope",
    "tiny-deepseek-v2",
    "tiny-deepseek-v2-q-lora",
]
# Mixed scripts, emoji with ZWJ, a decomposed accent (non-NFC), tabs and runs of spaces.
UTF8_TEXT = "Héllo wörld — 你好，世界 😀👩‍💻 Καλημέρα, Привет!\n\tdef f(x):  return x**2  e\u0301"


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    paths = {preset: make_model.make_checkpoint(root / preset, preset) for preset in TEST_PRESETS}
    paths["tiny-sharded"] = make_model.make_checkpoint(
        root / "tiny-sharded", "tiny", shard_size_bytes=2 * 2**20
    )
    return paths


def test_generation_is_byte_identical_across_runs_and_processes(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    # The CLI runs in a fresh process, so the tokenizer trainer's hash seeds differ too.
    cli_out = tmp_path / "cli-tiny"
    subprocess.run(
        [sys.executable, "-m", "quire_tools.make_model", "--preset", "tiny", "--out", str(cli_out)],
        check=True,
        capture_output=True,
    )
    again = make_model.make_checkpoint(tmp_path / "again", "tiny")
    make_model.make_checkpoint(again, "tiny")  # regenerating in place replaces it
    expected = _files(checkpoints["tiny"])
    assert set(expected) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert _files(cli_out) == expected
    assert _files(again) == expected
    assert make_model.tokenizer_json.__wrapped__("gpt2") == make_model.tokenizer_json("gpt2")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs left behind"


def test_seed_and_preset_change_weights() -> None:
    config = make_model.build_config("tiny")
    a = make_model.make_weights(config, "tiny", seed=0)
    b = make_model.make_weights(config, "tiny", seed=1)
    c = make_model.make_weights(config, "tiny-mistral", seed=0)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(a[name], b[name])
    assert not torch.equal(a[name], c[name])


@pytest.mark.parametrize("name", [*TEST_PRESETS, "tiny-sharded"])
def test_transformers_loads_and_runs(checkpoints: dict[str, Path], name: str) -> None:
    path = checkpoints[name]
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, "missing/unexpected/mismatched keys"
    assert model.dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer("The harbor town woke slowly.", return_tensors="pt").input_ids
    assert ids[0, 0].item() == BOS_ID
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], VOCAB_SIZE)
    assert torch.isfinite(logits).all()


def test_sharded_matches_single_file(checkpoints: dict[str, Path]) -> None:
    sharded = checkpoints["tiny-sharded"]
    shards = sorted(sharded.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    assert (sharded / "model.safetensors.index.json").exists()
    assert not (sharded / "model.safetensors").exists()
    single = AutoModelForCausalLM.from_pretrained(checkpoints["tiny"]).state_dict()
    split = AutoModelForCausalLM.from_pretrained(sharded).state_dict()
    assert single.keys() == split.keys()
    assert all(torch.equal(single[k], split[k]) for k in single)


def test_variant_features_reach_transformers(checkpoints: dict[str, Path]) -> None:
    mqa = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-mqa"])
    assert mqa.config.rope_parameters["rope_type"] == "llama3"
    assert mqa.model.layers[0].self_attn.k_proj.weight.shape == (64, 128)  # 1 kv head x 64
    default = 1.0 / 500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    ratio = default / mqa.model.rotary_emb.inv_freq
    assert ratio.min().item() == pytest.approx(1.0) and ratio.max().item() == pytest.approx(8.0)

    qwen2 = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-qwen2"])
    assert qwen2.lm_head.weight.data_ptr() == qwen2.model.embed_tokens.weight.data_ptr()
    assert qwen2.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    assert qwen2.config.sliding_window is None

    mistral = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-mistral"])
    assert mistral.config.sliding_window is None

    qwen3 = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-qwen3"])
    attn = qwen3.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (4 * 48, 128) and attn.q_norm.weight.shape == (48,)
    assert attn.q_proj.bias is None

    qwen3_moe = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-qwen3-moe"])
    kinds = [type(layer.mlp).__name__ for layer in qwen3_moe.model.layers]
    assert kinds == ["Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"]
    assert qwen3_moe.config.norm_topk_prob and qwen3_moe.config.num_experts == 4

    mixtral = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-mixtral"])
    experts = mixtral.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (8, 2 * 192, 128)
    assert mixtral.config.num_experts_per_tok == 2

    lite = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-deepseek-v2"])
    kinds = [type(layer.mlp).__name__ for layer in lite.model.layers]
    assert kinds == ["DeepseekV2MLP", "DeepseekV2Moe", "DeepseekV2Moe"]
    attn = lite.model.layers[0].self_attn
    assert attn.q_proj is not None and attn.kv_a_proj_with_mqa.weight.shape == (64 + 16, 128)
    assert lite.model.layers[1].mlp.shared_experts.gate_proj.weight.shape == (2 * 48, 128)
    assert lite.config.rope_parameters["rope_type"] == "yarn"
    q_lora = AutoModelForCausalLM.from_pretrained(checkpoints["tiny-deepseek-v2-q-lora"])
    attn = q_lora.model.layers[0].self_attn
    assert attn.q_proj is None and attn.q_b_proj.weight.shape == (2 * (96 + 32), 64)
    assert q_lora.config.routed_scaling_factor == 2.5


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2", "tiny-qwen3"])
def test_tokenizer_round_trips_and_matches_tokenizer_json(
    checkpoints: dict[str, Path], name: str
) -> None:
    path = checkpoints[name]
    tokenizer = AutoTokenizer.from_pretrained(path)
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert len(tokenizer) == raw.get_vocab_size() == VOCAB_SIZE
    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.convert_tokens_to_ids(specials) == [
        PAD_ID,
        BOS_ID,
        EOS_ID,
        IM_START_ID,
        IM_END_ID,
    ]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        BOS_ID,
        EOS_ID,
        PAD_ID,
    )
    # Qwen2 tokenizers (Qwen3's too) NFC-normalize, so only NFC text round-trips exactly there.
    text = UTF8_TEXT if name == "tiny" else UTF8_TEXT.replace("e\u0301", "\u00e9")
    ids = tokenizer(text).input_ids
    assert ids[0] == BOS_ID and BOS_ID not in ids[1:]
    assert raw.encode(text).ids == ids, "AutoTokenizer and tokenizer.json disagree"
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(ids[1:]) == text


def test_chat_template_renders(checkpoints: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoints["tiny"])
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi! 你好"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<s><|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi! 你好<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert not no_prompt.endswith("assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids == tokenizer(text, add_special_tokens=False).input_ids
    assert ids[:2] == [BOS_ID, IM_START_ID] and ids.count(IM_END_ID) == 2


def test_logits_are_decisive(checkpoints: dict[str, Path]) -> None:
    # Engine-vs-transformers greedy comparisons tolerate divergence only where the top-2 gap
    # is < 1e-3, so such positions must be rare, including deep into a long context.
    model = AutoModelForCausalLM.from_pretrained(checkpoints["tiny"])
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB_SIZE, (4, 400), generator=generator)
    ids[:, 0] = BOS_ID
    with torch.no_grad():
        top2 = model(ids).logits.topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).flatten()
    assert (gaps < 1e-3).float().mean().item() < 0.01
    assert gaps.median().item() > 0.1
