"""Executor logprobs in OpenAI's two shapes (completions' parallel lists, chat's objects)."""

from __future__ import annotations

from quire.engine.output_processor import top_alternatives
from quire.outputs import Logprob
from services.router.schemas import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
from services.router.token_text import TokenText


def completion_logprobs(
    token_text: TokenText,
    token_ids: list[int],
    logprobs: list[dict[int, Logprob]],
    text_offsets: list[int],
    k: int,
) -> CompletionLogprobs:
    """`tokens`, `token_logprobs`, `top_logprobs` (token text -> logprob), `text_offset`."""
    out = CompletionLogprobs()
    for token_id, top, offset in zip(token_ids, logprobs, text_offsets, strict=False):
        text = token_text.get(token_id)[0]
        value = top[token_id].logprob
        alternatives: dict[str, float] = {}
        for alt_id, alt_value in top_alternatives(top, k):
            alternatives.setdefault(token_text.get(alt_id)[0], alt_value)
        alternatives.setdefault(text, value)
        out.tokens.append(text)
        out.token_logprobs.append(value)
        out.top_logprobs.append(alternatives)
        out.text_offset.append(offset)
    return out


def chat_logprobs(
    token_text: TokenText, token_ids: list[int], logprobs: list[dict[int, Logprob]], k: int
) -> ChatLogprobs:
    """`content`: one object per token with its bytes and `top_logprobs` alternatives."""
    content = []
    for token_id, top in zip(token_ids, logprobs, strict=False):
        text, raw = token_text.get(token_id)
        alternatives = []
        for alt_id, value in top_alternatives(top, k):
            alt_text, alt_raw = token_text.get(alt_id)
            alternatives.append(TopLogprob(token=alt_text, logprob=value, bytes=alt_raw))
        content.append(
            ChatTokenLogprob(
                token=text, logprob=top[token_id].logprob, bytes=raw, top_logprobs=alternatives
            )
        )
    return ChatLogprobs(content=content)
