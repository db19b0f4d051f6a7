"""POST /v1/chat/completions: chat through the model's chat template, streaming or not."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.generation import Generation
from services.router.logprobs import chat_logprobs
from services.router.routes.generate import serve_generation
from services.router.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    DeltaMessage,
)
from services.router.sse import (
    build_params,
    new_id,
    sse,
    usage_info,
)
from services.router.state import RouterState

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    """OpenAI's chat completions: messages in, `n` assistant replies out."""
    state.check_model(body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    prompt = state.prompts.chat_prompt([m.for_template() for m in body.messages])
    requested = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "messages"
    max_tokens = state.prompts.check_context(prompt, requested, param)
    params = build_params(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
    response_id = new_id("chatcmpl")
    return await serve_generation(
        request,
        state,
        response_id,
        [prompt],
        params,
        body.stream,
        lambda generation: _chunks(state, generation, body, response_id),
        lambda generation: _response(state, generation, body, response_id),
    )


def _response(
    state: RouterState, generation: Generation, body: ChatCompletionRequest, response_id: str
) -> ChatCompletionResponse:
    choices = [
        ChatChoice(
            index=index,
            message=ChatResponseMessage(content=output.text),
            logprobs=(
                chat_logprobs(
                    state.token_text, output.token_ids, output.logprobs or [], output.num_logprobs
                )
                if body.logprobs
                else None
            ),
            finish_reason=output.finish_reason,
            stop_reason=output.stop_reason,
        )
        for index, output in enumerate(generation.choices)
    ]
    usage = generation.usage()
    state.metrics.generation_tokens.inc(usage.completion_tokens)
    return ChatCompletionResponse(
        id=response_id, model=state.settings.model_name, choices=choices, usage=usage_info(usage)
    )


async def _chunks(
    state: RouterState, generation: Generation, body: ChatCompletionRequest, response_id: str
) -> AsyncIterator[str]:
    model = state.settings.model_name

    def chunk(choice: ChatChunkChoice) -> str:
        message = ChatCompletionChunk(id=response_id, model=model, choices=[choice])
        if body.include_usage:
            return sse(message)
        return f"data: {message.model_dump_json(exclude={'usage'})}\n\n"

    for index in range(len(generation.choices)):
        yield chunk(ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content="")))
    finish_sent: set[int] = set()
    async for touched in generation.updates():
        for index in touched:
            output = generation.choices[index]
            text = output.take_text()
            token_ids, logprobs, _ = output.take_tokens()
            finish = None
            if output.is_finished and index not in finish_sent:
                finish = output.finish_reason
                finish_sent.add(index)
            if not text and finish is None and not (body.logprobs and logprobs):
                continue
            yield chunk(
                ChatChunkChoice(
                    index=index,
                    delta=DeltaMessage(content=text) if text else DeltaMessage(),
                    logprobs=(
                        chat_logprobs(state.token_text, token_ids, logprobs, output.num_logprobs)
                        if body.logprobs
                        else None
                    ),
                    finish_reason=finish,
                    stop_reason=output.stop_reason if finish else None,
                )
            )
    usage = generation.usage()
    state.metrics.generation_tokens.inc(usage.completion_tokens)
    if body.include_usage:
        yield sse(
            ChatCompletionChunk(id=response_id, model=model, choices=[], usage=usage_info(usage))
        )
