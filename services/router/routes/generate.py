"""What completions and chat share: start a generation, then stream it or answer once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from quire.sampling_params import SamplingParams
from services.router.generation import Generation, start_generation
from services.router.sse import event_stream, unless_disconnected
from services.router.state import RouterState


async def serve_generation(
    request: Request,
    state: RouterState,
    response_id: str,
    prompts: list[list[int]],
    params: SamplingParams,
    stream: bool,
    chunks: Callable[[Generation], AsyncIterator[str]],
    response: Callable[[Generation], BaseModel],
) -> Response:
    """Route and run `prompts`; SSE chunks when `stream`, else one JSON response."""
    generation = await unless_disconnected(
        request,
        start_generation(
            state.dispatcher,
            state.tokenizer,
            response_id,
            prompts,
            params,
            stream,
            request.state.arrival,
            state.settings.extra_key,
            state.settings.block_size,
        ),
    )
    headers = {"x-quire-executor": generation.executor_ids}
    if stream:
        return event_stream(generation, lambda: chunks(generation), headers)
    try:
        await unless_disconnected(request, generation.run_to_end())
    finally:
        generation.close()
    return JSONResponse(response(generation).model_dump(mode="json"), headers=headers)
