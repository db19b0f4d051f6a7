"""Offline API contract: bad input, streaming, abort, output order, counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from quire import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> LLM:
    return LLM(model=str(tiny_model), max_model_len=256)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"logprobs": 1000}, "logprobs"),
        ({"presence_penalty": 5.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_prompts_raise_and_disturb_nothing_in_flight(llm: LLM) -> None:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("keep", "A story about a cat", params)
    deltas = list(engine.step().outputs)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([""], use_tqdm=False)
    with pytest.raises(ValueError, match="context"):
        llm.generate([{"prompt_token_ids": [5] * 300}], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate([{"prompt_token_ids": [10**9]}], use_tqdm=False)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        llm.generate(["fine", ""], use_tqdm=False)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("keep", "again", SamplingParams())
    while engine.has_unfinished_requests():
        deltas.extend(engine.step().outputs)
    keep = [d for d in deltas if d.request_id == "keep"]
    assert [d.finished for d in keep].count(True) == 1 and keep[-1].finished
    assert sum(len(s.new_token_ids) for d in keep for s in d.outputs) == 8
    assert engine.allocator.stats().num_blocks_used == 0


def test_unknown_model_path_and_architecture(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        LLM(model=str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.mkdir()
    config = (tiny_model / "config.json").read_text()
    (bad / "config.json").write_text(
        config.replace("LlamaForCausalLM", "GPT2LMHeadModel").replace('"llama"', '"gpt2"')
    )
    with pytest.raises(ValueError, match="architecture"):
        LLM(model=str(bad))
    missing = tmp_path / "noweights"
    missing.mkdir()
    (missing / "config.json").write_text(config)
    with pytest.raises(ValueError, match="safetensors"):
        LLM(model=str(missing))


def test_outputs_in_input_order_and_text_decodes(llm: LLM) -> None:
    prompts = ["Hello there", {"prompt_token_ids": [1, 2, 3, 4]}, "Ünïcödé 漢字 🙂"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert [o.prompt for o in outs] == ["Hello there", None, "Ünïcödé 漢字 🙂"]
    tok = llm.get_tokenizer()
    for o in outs:
        c = o.outputs[0]
        # The streamed text is the whole decode, less a trailing incomplete character.
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True).rstrip("\ufffd")


def test_streaming_is_incremental_and_abort_frees_blocks(llm: LLM) -> None:
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    engine.add_request("s", "Streaming text", params)
    engine.add_request("a", "To be aborted " * 5, params)
    new_tokens = []
    for _ in range(5):
        for out in engine.step().outputs:
            if out.request_id == "s":
                new_tokens.append([len(s.new_token_ids) for s in out.outputs])
    # One delta per step once decoding, each carrying only that step's token.
    assert len(new_tokens) >= 3 and all(n == [1] for n in new_tokens)
    assert engine.allocator.stats().num_blocks_used > 0
    assert engine.abort_request("a")
    assert not engine.abort_request("unknown")
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # the abort's free lands with the next allocator call
    assert engine.allocator.stats().num_blocks_used == 0


def test_sharded_checkpoint_loads_identically(tmp_path: Path, tiny_model: Path) -> None:
    from quire_tools.make_model import make_checkpoint

    sharded = make_checkpoint(tmp_path / "sharded", "tiny", shard_size_bytes=400_000)
    assert (sharded / "model.safetensors.index.json").is_file()
    params = SamplingParams(temperature=0, max_tokens=8)
    a = LLM(model=str(tiny_model)).generate(["Shards"], params, use_tqdm=False)
    b = LLM(model=str(sharded)).generate(["Shards"], params, use_tqdm=False)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids


def test_decode_gathers_are_planned_once_per_step(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quire.kernels as kernels

    planned = 0
    plan_decode = kernels.plan_decode

    def counting(*args: object) -> object:
        nonlocal planned
        planned += 1
        return plan_decode(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "plan_decode", counting)
    # the layer-by-layer path plans; a fused C++ layer reads the block tables itself
    monkeypatch.setattr(llm.engine.model, "fused_layers", None)
    [out] = llm.generate(
        [{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=6, ignore_eos=True)
    )
    assert len(out.outputs[0].token_ids) == 6
    assert planned == 5  # one per decode step (the first token comes from the prefill step)
