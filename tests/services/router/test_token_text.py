"""Single-token text and bytes for logprobs."""

from __future__ import annotations

from typing import Any

from services.router.token_text import TokenText


def test_token_text_bytes_of_partial_characters(tokenizer: Any) -> None:
    token_text = TokenText(tokenizer)
    ids = tokenizer.encode("日本", add_special_tokens=False)
    raw = b"".join(bytes(token_text.get(i)[1]) for i in ids)
    assert raw.decode("utf-8") == "日本"
    assert token_text.get(1) == ("<s>", list(b"<s>"))
