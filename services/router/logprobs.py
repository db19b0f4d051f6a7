"""Executor logprobs in OpenAI's two shapes (completions' parallel lists, chat's objects)."""

from __future__ import annotations

from services.router.output import TokenLogprob, TokenText
from services.router.schemas import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)


def completion_logprobs(
    token_text: TokenText, logprobs: list[TokenLogprob], text_offsets: list[int]
) -> CompletionLogprobs:
    """`tokens`, `token_logprobs`, `top_logprobs` (token text -> logprob), `text_offset`."""
    out = CompletionLogprobs()
    for lp, offset in zip(logprobs, text_offsets, strict=False):
        text = token_text.get(lp.token_id)[0]
        top: dict[str, float] = {}
        for token_id, value in lp.top:
            top.setdefault(token_text.get(token_id)[0], value)
        top.setdefault(text, lp.logprob)
        out.tokens.append(text)
        out.token_logprobs.append(lp.logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
    return out


def chat_logprobs(token_text: TokenText, logprobs: list[TokenLogprob]) -> ChatLogprobs:
    """`content`: one object per token with its bytes and `top_logprobs` alternatives."""
    content = []
    for lp in logprobs:
        text, raw = token_text.get(lp.token_id)
        top = []
        for token_id, value in lp.top:
            top_text, top_raw = token_text.get(token_id)
            top.append(TopLogprob(token=top_text, logprob=value, bytes=top_raw))
        content.append(
            ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top)
        )
    return ChatLogprobs(content=content)
