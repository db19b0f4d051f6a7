"""POST /v1/completions: text completion, streaming (SSE) or not.

Beyond the plain completion: `echo` (the text, and with `logprobs` the logprobs, start with
the prompt; streamed, the prompt comes in each choice's first chunk), `best_of` (best_of
candidates per prompt, the best n by cumulative logprob returned; not streamed) and vLLM's
`prompt_logprobs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.generation import ChoiceUpdate, PromptInfo
from services.router.generation_response import build_params, new_id, serve_generation
from services.router.logprobs import (
    completion_logprobs,
    concat_logprobs,
    echo_logprobs,
    prompt_logprobs,
)
from services.router.schemas import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    PromptLogprobs,
    UsageInfo,
)
from services.router.structured_fields import check_spec
from services.router.token_text import TokenText

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    """OpenAI's completions: a prompt (or a batch of them) in, `n` completions per prompt."""
    state.check_model(body.model)
    if body.suffix:
        raise bad_request("suffix is not supported", "suffix")
    structured = body.requested_structured()
    if structured is not None:
        check_spec(structured[1], structured[0])
    prompts = state.prompts.completion_prompts(body.prompt)
    max_tokens = min(state.prompts.check_context(p, body.max_tokens, "prompt") for p in prompts)
    best_of = body.best_of or body.n
    # Echo with logprobs needs the prompt tokens' logprobs too (at least as many top-k).
    wanted = [
        k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None
    ]
    params = build_params(
        body,
        max_tokens,
        body.logprobs,
        state.prompts.vocab_size,
        prompt_logprobs=max(wanted) if wanted else None,
        n=best_of,
    )
    if structured is not None:
        params.structured = structured[1]
    response_id = new_id("cmpl")
    shape = CompletionShape(
        token_text=state.token_text,
        response_id=response_id,
        model=state.settings.model_name,
        num_logprobs=body.logprobs,
        n=body.n,
        echo_texts=_prompt_texts(body.prompt, prompts, state.tokenizer) if body.echo else None,
        num_prompt_logprobs=body.prompt_logprobs,
        return_token_ids=body.return_token_ids,
    )
    return await serve_generation(
        request,
        state,
        response_id,
        prompts,
        params,
        body.max_tokens,
        body,
        shape,
        num_returned=body.n if best_of != body.n else None,
    )


def _prompt_texts(
    prompt: str | list[Any], prompt_ids: list[list[int]], tokenizer: Any
) -> list[str]:
    """Each prompt as echoed: the text the client sent, or its token ids decoded."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return [str(p) for p in prompt]
    return [str(tokenizer.decode(ids)) for ids in prompt_ids]


@dataclass(frozen=True)
class CompletionShape:
    """Completions' objects: `text_completion`, whole or as chunks of the same type."""

    token_text: TokenText
    response_id: str
    model: str
    num_logprobs: int | None  # logprobs asked for (None: no logprobs object)
    n: int = 1  # choices per prompt: choice i * n + j belongs to prompt i
    echo_texts: list[str] | None = None  # per prompt, when echo is on
    num_prompt_logprobs: int | None = None  # vLLM's prompt_logprobs, when asked for
    return_token_ids: bool = False  # vLLM's return_token_ids

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
        echo = self.echo_texts[update.index // self.n] if self.echo_texts is not None else None
        text = update.text
        if echo is not None and update.prompt is not None:
            text = echo + text
        return CompletionChoice(
            index=update.index,
            text=text,
            logprobs=self._logprobs(update, len(echo or "")),
            finish_reason=update.finish_reason,
            stop_reason=update.stop_reason,
            prompt_logprobs=self._prompt_logprobs(update.prompt),
            prompt_token_ids=(
                list(update.prompt.token_ids)
                if self.return_token_ids and update.prompt is not None
                else None
            ),
            token_ids=list(update.token_ids) if self.return_token_ids else None,
        )

    def _logprobs(self, update: ChoiceUpdate, shift: int) -> CompletionLogprobs | None:
        if self.num_logprobs is None:
            return None
        # Output offsets count from the start of the choice's text: past the echoed prompt.
        out = completion_logprobs(
            self.token_text,
            update.token_ids,
            update.logprobs,
            [offset + shift for offset in update.text_offsets],
            self.num_logprobs,
        )
        if self.echo_texts is None or update.prompt is None:
            return out
        prompt = update.prompt
        return concat_logprobs(
            echo_logprobs(self.token_text, prompt.token_ids, prompt.logprobs, self.num_logprobs),
            out,
        )

    def _prompt_logprobs(self, prompt: PromptInfo | None) -> PromptLogprobs | None:
        if self.num_prompt_logprobs is None or prompt is None:
            return None
        return prompt_logprobs(
            self.token_text, prompt.token_ids, prompt.logprobs, self.num_prompt_logprobs
        )
