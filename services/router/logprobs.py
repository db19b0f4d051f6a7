"""Executor logprobs in OpenAI's two shapes (completions' parallel lists, chat's objects),
and prompt logprobs: vLLM's `prompt_logprobs` and an echoed prompt's completions logprobs."""

from __future__ import annotations

from quire.engine.output_processor import top_alternatives
from quire.outputs import Logprob
from services.router.schemas import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
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


def prompt_logprobs(
    token_text: TokenText, token_ids: list[int], logprobs: list[dict[int, Logprob]] | None, k: int
) -> PromptLogprobs:
    """vLLM's `prompt_logprobs`: None for the first token, then token id -> logprob, rank
    and decoded token for the top-`k` alternatives and the prompt token itself."""
    out: PromptLogprobs = [None]
    for token_id, top in zip(token_ids[1:], logprobs or [], strict=False):
        entry: dict[int, PromptLogprob] = {}
        ranked = sorted(top.items(), key=lambda item: item[1].rank)
        for alt_id, lp in [*ranked[:k], (token_id, top[token_id])]:
            entry.setdefault(
                alt_id,
                PromptLogprob(
                    logprob=lp.logprob, rank=lp.rank, decoded_token=token_text.get(alt_id)[0]
                ),
            )
        out.append(entry)
    return out


def echo_logprobs(
    token_text: TokenText, token_ids: list[int], logprobs: list[dict[int, Logprob]] | None, k: int
) -> CompletionLogprobs:
    """Completions' logprobs of an echoed prompt: the first token's logprob and
    alternatives are None (nothing precedes it); offsets count the tokens' own texts."""
    out = CompletionLogprobs()
    if not token_ids:
        return out
    offsets = []
    offset = 0
    for token_id in token_ids:
        offsets.append(offset)
        offset += len(token_text.get(token_id)[0])
    first = token_text.get(token_ids[0])[0]
    out.tokens.append(first)
    out.token_logprobs.append(None)
    out.top_logprobs.append(None)
    out.text_offset.append(0)
    rest = completion_logprobs(token_text, token_ids[1:], logprobs or [], offsets[1:], k)
    return concat_logprobs(out, rest)


def concat_logprobs(first: CompletionLogprobs, second: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=first.tokens + second.tokens,
        token_logprobs=first.token_logprobs + second.token_logprobs,
        top_logprobs=first.top_logprobs + second.top_logprobs,
        text_offset=first.text_offset + second.text_offset,
    )
