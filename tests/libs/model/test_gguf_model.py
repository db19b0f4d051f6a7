"""A GGUF file served as it is (`--model file.gguf`): weights kept in their quantized blocks,
greedy tokens against transformers' GGUF loader (which dequantizes to float32), the tokenizer
and chat template from the file, resident memory against the file's size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from quire_tools import gguf_convert, gguf_write
from transformers import AutoModelForCausalLM

from quire import LLM, SamplingParams
from quire.config import EngineConfig
from quire.engine.loading import load_engine_model
from quire.kernels import cpp_quantized, reference_quantized
from quire.model.checkpoint import checkpoint_problem, load_model_config, load_tokenizer
from quire.model.quantized_linear import QuantizedLinear, QuantizedTensor, embedding
from quire.model.resident import resident_bytes
from tests.checkpoints import REPO, tiny_checkpoint
from tests.libs.engine.conftest import Reference, assert_matches_reference
from tests.tools.test_gguf_convert import write_tiny_gguf

PROMPTS = ["Hello world, the quick brown fox", "In the beginning", "1 2 3 4"]
MAX_TOKENS = 16
SMOLLM2_GGUF = REPO / "models" / "smollm2-135m-instruct.Q4_1.gguf"
SMOLLM2_FLOAT = REPO / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """quire-tiny in each 32-block format (embedding Q8_0), and a file mixing Q4_1, Q8_0, F16
    and F32 tensors the way llama.cpp's converter writes them."""
    root = tmp_path_factory.mktemp("gguf-model")
    files = {
        quant: gguf_write.write_gguf(tiny_checkpoint(), root / f"tiny.{quant}.gguf", quant)
        for quant in ("Q4_1", "Q8_0", "Q4_0")
    }
    write_tiny_gguf(root / "mixed.gguf", tied=False)
    return {**files, "mixed": root / "mixed.gguf"}


def reference(
    path: Path, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = True
) -> Reference:
    """transformers' greedy tokens and top-2 gaps on a GGUF (its loader dequantizes to
    float32) or a float32 checkpoint folder; without `ignore_eos`, up to and with the eos."""
    if path.is_dir():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens if ignore_eos else None,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    gaps = [float(a - b) for a, b in (step[0].float().topk(2).values for step in out.logits)]
    return Reference(out.sequences[0, len(prompt_ids) :].tolist(), gaps)


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_0", "mixed"])
def test_greedy_tokens_equal_transformers_gguf_loader(ggufs: dict[str, Path], name: str) -> None:
    path = ggufs[name]
    assert checkpoint_problem(path) is None
    tokenizer = load_tokenizer(path)
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    llm = LLM(model=str(path), dtype="float32", quantized_activations="float32")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    for ids, output in zip(prompts, outputs, strict=True):
        got = list(output.outputs[0].token_ids)
        assert_matches_reference(got, reference(path, ids, MAX_TOKENS), f"{name} {ids[:4]}")


def test_weights_stay_in_blocks(ggufs: dict[str, Path]) -> None:
    path = ggufs["Q4_1"]
    loaded = load_engine_model(EngineConfig(model=str(path), dtype="float32"))
    layer = loaded.model.layers[0]
    assert isinstance(layer.attention.qkv, QuantizedLinear)
    # q, k, v rows end to end; interleaved for the int8 kernel where the CPU has AVX512_VNNI
    interleaved = cpp_quantized.supports("Q4_1x16", torch.float32)
    expected = "Q4_1x16" if interleaved else "Q4_1"
    assert [p.quant for p in layer.attention.qkv.parts] == [expected]
    assert isinstance(loaded.model.lm_head, QuantizedLinear)  # untied: output.weight, Q4_1
    # every weight in blocks: what the model holds is the file's tensors, plus rotary tables
    rotary = resident_bytes(loaded.model.rotary)
    assert resident_bytes(loaded.model) - rotary <= path.stat().st_size


def test_config_tokenizer_and_refusals(ggufs: dict[str, Path], tmp_path: Path) -> None:
    path = ggufs["mixed"]
    config = load_model_config(path)
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (2, 4, 2)
    assert load_tokenizer(path).chat_template is not None
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF not really")
    assert "is not a GGUF file Quire can load" in str(checkpoint_problem(broken))
    (tmp_path / "folder.gguf").mkdir()
    assert "is not a file" in str(checkpoint_problem(tmp_path / "folder.gguf"))


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return gguf_convert.packaged_gguf(SMOLLM2_GGUF, cache_dir=REPO / gguf_convert.DEFAULT_CACHE_DIR)


def test_packaged_smollm2_q4_1_serves_as_it_is(smollm2_gguf: Path) -> None:
    tokenizer = load_tokenizer(smollm2_gguf)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(question, add_generation_prompt=True)["input_ids"]
    llm = LLM(model=str(smollm2_gguf), dtype="float32", quantized_activations="float32")
    params = SamplingParams(max_tokens=32, temperature=0.0)
    got = list(llm.generate([{"prompt_token_ids": ids}], params)[0].outputs[0].token_ids)
    assert "Paris" in tokenizer.decode(got)
    # The reference: transformers on the default float32 checkpoint, which is this file's
    # tensors dequantized by the gguf package's numpy reference, as transformers' GGUF loader
    # does (quire_tools.gguf_convert), without dequantizing 135M weights again here.
    expected = reference(SMOLLM2_FLOAT, ids, 32, ignore_eos=False)
    assert_matches_reference(got, expected, "smollm2 Q4_1")
    # resident weights (quantized blocks, float norms, rotary tables) against the file
    assert resident_bytes(llm.engine.model) <= 1.15 * smollm2_gguf.stat().st_size


LOGPROB_TEXTS = [
    "The capital of France is Paris, and the capital of Germany is Berlin. Rivers that run",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)",
    "Photosynthesis is the process by which green plants use sunlight to make food.",
]


def test_int8_activations_keep_smollm2_near_transformers(smollm2_gguf: Path) -> None:
    """The default int8 activations (quantized_activations) move SmolLM2's logprobs, of the
    prompts (prefill rows) and of its own greedy tokens (decode rows), by hundredths of a nat
    from transformers' on the dequantized weights; float32 activations (above) are
    token-exact."""
    tokenizer = load_tokenizer(smollm2_gguf)
    prompts = [tokenizer.encode(text) for text in LOGPROB_TEXTS]
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2_FLOAT, dtype=torch.float32).eval()
    llm = LLM(model=str(smollm2_gguf), dtype="float32")
    assert llm.engine.config.quantized_activations == "int8"
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    errors = []
    for ids, output in zip(prompts, outputs, strict=True):
        choice = output.outputs[0]
        assert output.prompt_logprobs is not None and choice.logprobs is not None
        tokens = ids + list(choice.token_ids)
        got = [lps[t].logprob for lps, t in zip(output.prompt_logprobs[1:], ids[1:], strict=True)]
        got += [lps[t].logprob for lps, t in zip(choice.logprobs, choice.token_ids, strict=True)]
        with torch.inference_mode():
            logprobs = model(torch.tensor([tokens[:-1]])).logits[0].log_softmax(-1)
        expected = [logprobs[j, tokens[j + 1]].item() for j in range(len(tokens) - 1)]
        errors.append((torch.tensor(got) - torch.tensor(expected)).abs())
    # int8 rounding of every activation: a few hundredths of a nat per token on this model (for
    # the same reason llama.cpp's perplexity on this file is 0.3% above the F32 file's)
    error = torch.cat(errors)
    assert error.mean() < 0.1 and error.max() < 0.5, error.tolist()
    assert error.max() > 0, "int8 activations should not be exact"


def test_interleaved_weights_give_the_row_major_ones_values(ggufs: dict[str, Path]) -> None:
    """Where the CPU has AVX512_VNNI, a model with int8 activations holds its 32-weight blocks
    interleaved (quantized_linear.interleaved), the tied table once: its embedding rows are the
    row-major table's, its LM head's products theirs up to float32 sums in another order."""
    if not cpp_quantized.supports("Q8_0x16", torch.float32):
        pytest.skip("needs AVX512_VNNI: the interleaved layout's kernel")
    path = ggufs["Q8_0"]
    model = load_engine_model(EngineConfig(model=str(path), dtype="float32")).model
    (head,) = model.lm_head.parts
    assert head.quant == "Q8_0x16"
    # a tied table is held once (SmolLM2's: test_packaged_smollm2_q4_1_serves_as_it_is bounds
    # its resident bytes); an untied embedding table stays as the file holds it
    assert (
        (model.embed is head) if model.config.tie_word_embeddings else model.embed.quant == "Q8_0"
    )
    blocks, quant = reference_quantized.deinterleave(head.blocks, head.quant)
    row_major = QuantizedTensor(quant, blocks, head.in_features, head.dtype, True)
    ids = torch.tensor([5, 17, 3, 250, 9, 1, 5])
    assert torch.equal(embedding(ids, head), embedding(ids, row_major))
    hidden = torch.randn(3, head.in_features, generator=torch.Generator().manual_seed(0))
    got = model.lm_head(hidden)
    expected = QuantizedLinear([row_major], None)(hidden)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    float_only = load_engine_model(
        EngineConfig(model=str(path), dtype="float32", quantized_activations="float32")
    ).model
    assert float_only.lm_head.parts[0].quant == "Q8_0"  # the layout's only fast road is int8
