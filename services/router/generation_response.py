"""What completions and chat share: start a generation, then stream it or answer once.

The two routes differ only in the objects they write, so each hands over a `ResponseShape`
and this module runs the one loop: the generation's choice updates, framed as SSE chunks (or
gathered into one JSON response), then usage.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Protocol

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from quire.sampling_params import ParamError, SamplingParams
from services.router.admission.rate_limits import charge_request, requested_tokens
from services.router.errors import bad_request
from services.router.generation import ChoiceUpdate, Generation, Usage, start_generation
from services.router.schemas import PromptTokensDetails, SamplingRequest, UsageInfo
from services.router.sse import event_stream, sse, unless_disconnected
from services.router.state import RouterState


class ResponseShape(Protocol):
    """How one route writes a generation as its own OpenAI objects."""

    def opening(self, num_choices: int) -> list[BaseModel]:
        """Chunks sent before any output (chat's assistant role)."""
        ...

    def chunks(self, updates: list[ChoiceUpdate]) -> list[BaseModel]:
        """The chunks carrying one executor response's choice updates."""
        ...

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        """The last chunk, when the client asked for usage."""
        ...

    def response(self, choices: list[ChoiceUpdate], usage: UsageInfo) -> BaseModel:
        """The whole response of a request that is not streamed."""
        ...


def new_id(prefix: str) -> str:
    """A fresh response id (`cmpl-...`, `chatcmpl-...`)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def build_params(
    body: SamplingRequest,
    max_tokens: int,
    logprobs: int | None,
    vocab_size: int,
    prompt_logprobs: int | None = None,
    n: int | None = None,
) -> SamplingParams:
    """SamplingParams from a request, as a 400 naming the field when a value is invalid
    (token ids outside the model's vocab included).

    `prompt_logprobs` and `n` replace the body's (echo with logprobs, best_of)."""
    try:
        params = body.sampling_params(max_tokens, logprobs, prompt_logprobs, n)
        params.check_vocab(vocab_size)
        return params
    except ParamError as exc:
        param = exc.param if exc.param in type(body).model_fields else None
        raise bad_request(str(exc), param) from exc
    except ValueError as exc:
        raise bad_request(str(exc)) from exc


def usage_info(usage: Usage) -> UsageInfo:
    """A request's token counts in OpenAI's shape."""
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


async def serve_generation(
    request: Request,
    state: RouterState,
    response_id: str,
    prompts: list[list[int]],
    params: SamplingParams,
    max_tokens: int | None,
    body: SamplingRequest,
    shape: ResponseShape,
    num_returned: int | None = None,
) -> Response:
    """Charge the rate limits, route and run `prompts`; SSE chunks when the body asks to
    stream, else one JSON response, both written by `shape`.

    `max_tokens` is what the client asked for (None: the rest of the context), which is
    what the token rate limit counts. `num_returned` (best_of) keeps only each prompt's
    best `num_returned` of its `params.n` outputs, by cumulative logprob (not streamed).
    """
    cost = requested_tokens(prompts, params.n, max_tokens, state.max_model_len)
    await charge_request(request, state.rate_limiter, cost)
    generation = await unless_disconnected(
        request,
        start_generation(
            state.dispatcher,
            state.tokenizer,
            response_id,
            prompts,
            params,
            body.stream,
            request.state.arrival,
        ),
    )
    headers = {"x-quire-executor": generation.executor_ids}
    if body.stream:
        chunks = _chunks(state, generation, shape, body.include_usage)
        return event_stream(generation, chunks, headers)
    try:
        await unless_disconnected(request, generation.run_to_end())
    finally:
        generation.close()
    usage = _count(state, generation, num_returned)
    response = shape.response(generation.whole_choices(num_returned), usage)
    return JSONResponse(response.model_dump(mode="json"), headers=headers)


async def _chunks(
    state: RouterState, generation: Generation, shape: ResponseShape, include_usage: bool
) -> AsyncIterator[str]:
    # Without stream_options.include_usage, OpenAI's chunks carry no `usage` key at all.
    exclude = None if include_usage else {"usage"}
    for chunk in shape.opening(len(generation.choices)):
        yield sse(chunk, exclude)
    async for updates in generation.choice_updates():
        for chunk in shape.chunks(updates):
            yield sse(chunk, exclude)
    usage = _count(state, generation)
    if include_usage:
        yield sse(shape.usage_chunk(usage))


def _count(
    state: RouterState, generation: Generation, num_returned: int | None = None
) -> UsageInfo:
    # The metric counts every token generated; the usage only the choices returned (vLLM).
    state.metrics.generation_tokens.inc(generation.usage().completion_tokens)
    return usage_info(generation.usage_of(num_returned))
