"""POST /v1/completions: text completion, streaming (SSE) or not."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.generation import Generation
from services.router.logprobs import completion_logprobs
from services.router.routes.generate import serve_generation
from services.router.schemas import CompletionChoice, CompletionRequest, CompletionResponse
from services.router.sse import (
    build_params,
    new_id,
    sse,
    usage_info,
)
from services.router.state import RouterState

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    """OpenAI's completions: a prompt (or a batch of them) in, `n` completions per prompt."""
    state.check_model(body.model)
    if body.echo:
        raise bad_request("echo is not supported", "echo")
    if body.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("best_of must equal n (no server-side best-of selection)", "best_of")
    prompts = state.prompts.completion_prompts(body.prompt)
    max_tokens = min(state.prompts.check_context(p, body.max_tokens, "prompt") for p in prompts)
    params = build_params(body, max_tokens, body.logprobs)
    response_id = new_id("cmpl")
    return await serve_generation(
        request,
        state,
        response_id,
        prompts,
        params,
        body.stream,
        lambda generation: _chunks(state, generation, body, response_id),
        lambda generation: _response(state, generation, body, response_id),
    )


def _response(
    state: RouterState, generation: Generation, body: CompletionRequest, response_id: str
) -> CompletionResponse:
    choices = []
    for index, output in enumerate(generation.choices):
        logprobs = None
        if body.logprobs is not None:
            logprobs = completion_logprobs(
                state.token_text,
                output.token_ids,
                output.logprobs or [],
                output.text_offsets,
                output.num_logprobs,
            )
        choices.append(
            CompletionChoice(
                index=index,
                text=output.text,
                logprobs=logprobs,
                finish_reason=output.finish_reason,
                stop_reason=output.stop_reason,
            )
        )
    state.metrics.generation_tokens.inc(generation.usage().completion_tokens)
    return CompletionResponse(
        id=response_id,
        model=state.settings.model_name,
        choices=choices,
        usage=usage_info(generation.usage()),
    )


async def _chunks(
    state: RouterState, generation: Generation, body: CompletionRequest, response_id: str
) -> AsyncIterator[str]:
    model = state.settings.model_name
    finish_sent: set[int] = set()
    async for touched in generation.updates():
        choices = []
        for index in touched:
            output = generation.choices[index]
            text = output.take_text()
            token_ids, logprobs, offsets = output.take_tokens()
            finish = None
            if output.is_finished and index not in finish_sent:
                finish = output.finish_reason
                finish_sent.add(index)
            if not text and finish is None and not (body.logprobs is not None and token_ids):
                continue
            choices.append(
                CompletionChoice(
                    index=index,
                    text=text,
                    logprobs=(
                        completion_logprobs(
                            state.token_text, token_ids, logprobs, offsets, output.num_logprobs
                        )
                        if body.logprobs is not None
                        else None
                    ),
                    finish_reason=finish,
                    stop_reason=output.stop_reason if finish else None,
                )
            )
        if choices:
            chunk = CompletionResponse(id=response_id, model=model, choices=choices)
            yield _dump(chunk, body.include_usage)
    state.metrics.generation_tokens.inc(generation.usage().completion_tokens)
    if body.include_usage:
        final = CompletionResponse(
            id=response_id, model=model, choices=[], usage=usage_info(generation.usage())
        )
        yield sse(final)


def _dump(chunk: CompletionResponse, include_usage: bool) -> str:
    if include_usage:
        return sse(chunk)
    return f"data: {chunk.model_dump_json(exclude={'usage'})}\n\n"
