"""POST /v1/completions: text completion, streaming (SSE) or not."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.generation import ChoiceUpdate
from services.router.logprobs import completion_logprobs
from services.router.routes.generate import build_params, new_id, serve_generation
from services.router.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from services.router.structured import check_spec
from services.router.token_text import TokenText

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
    structured = body.requested_structured()
    if structured is not None:
        check_spec(structured[1], structured[0])
    prompts = state.prompts.completion_prompts(body.prompt)
    max_tokens = min(state.prompts.check_context(p, body.max_tokens, "prompt") for p in prompts)
    params = build_params(body, max_tokens, body.logprobs)
    if structured is not None:
        params.structured = structured[1]
    response_id = new_id("cmpl")
    shape = CompletionShape(
        state.token_text, response_id, state.settings.model_name, body.logprobs is not None
    )
    return await serve_generation(
        request, state, response_id, prompts, params, body.max_tokens, body, shape
    )


@dataclass(frozen=True)
class CompletionShape:
    """Completions' objects: `text_completion`, whole or as chunks of the same type."""

    token_text: TokenText
    response_id: str
    model: str
    with_logprobs: bool

    def opening(self, num_choices: int) -> list[BaseModel]:
        """Completions start with the first text."""
        return []

    def chunks(self, updates: list[ChoiceUpdate]) -> list[BaseModel]:
        """One chunk carrying every choice that advanced."""
        return [self._object([self._choice(u) for u in updates])]

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        """The chunk with no choices that carries the usage."""
        return self._object([], usage)

    def response(self, choices: list[ChoiceUpdate], usage: UsageInfo) -> BaseModel:
        """The whole `text_completion` object."""
        return self._object([self._choice(c) for c in choices], usage)

    def _object(
        self, choices: list[CompletionChoice], usage: UsageInfo | None = None
    ) -> CompletionResponse:
        return CompletionResponse(
            id=self.response_id, model=self.model, choices=choices, usage=usage
        )

    def _choice(self, update: ChoiceUpdate) -> CompletionChoice:
        return CompletionChoice(
            index=update.index,
            text=update.text,
            logprobs=self._logprobs(update),
            finish_reason=update.finish_reason,
            stop_reason=update.stop_reason,
        )

    def _logprobs(self, update: ChoiceUpdate) -> CompletionLogprobs | None:
        if not self.with_logprobs:
            return None
        return completion_logprobs(
            self.token_text,
            update.token_ids,
            update.logprobs,
            update.text_offsets,
            update.num_logprobs,
        )
