"""POST /v1/chat/completions: chat through the model's chat template, streaming or not."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.generation import ChoiceUpdate
from services.router.logprobs import chat_logprobs, prompt_logprobs
from services.router.routes.generate import build_params, new_id, serve_generation
from services.router.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    DeltaMessage,
    PromptLogprobs,
    UsageInfo,
)
from services.router.token_text import TokenText

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
    params = build_params(
        body,
        max_tokens,
        (body.top_logprobs or 0) if body.logprobs else None,
        state.prompts.vocab_size,
    )
    response_id = new_id("chatcmpl")
    shape = ChatShape(
        state.token_text,
        response_id,
        state.settings.model_name,
        body.logprobs,
        body.prompt_logprobs,
    )
    return await serve_generation(
        request, state, response_id, [prompt], params, requested, body, shape
    )


@dataclass(frozen=True)
class ChatShape:
    """Chat's objects: `chat.completion`, or `chat.completion.chunk`s of one choice each."""

    token_text: TokenText
    response_id: str
    model: str
    with_logprobs: bool
    num_prompt_logprobs: int | None = None  # vLLM's prompt_logprobs (response level)

    def opening(self, num_choices: int) -> list[BaseModel]:
        """Every choice's first chunk names the assistant role, before any content."""
        return [
            self._chunk(
                [ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))]
            )
            for i in range(num_choices)
        ]

    def chunks(self, updates: list[ChoiceUpdate]) -> list[BaseModel]:
        """One chunk per choice that advanced."""
        return [
            self._chunk(
                [
                    ChatChunkChoice(
                        index=u.index,
                        delta=DeltaMessage(content=u.text) if u.text else DeltaMessage(),
                        logprobs=self._logprobs(u),
                        finish_reason=u.finish_reason,
                        stop_reason=u.stop_reason,
                    )
                ]
            )
            for u in updates
        ]

    def usage_chunk(self, usage: UsageInfo) -> BaseModel:
        """The chunk with no choices that carries the usage."""
        return self._chunk([], usage)

    def response(self, choices: list[ChoiceUpdate], usage: UsageInfo) -> BaseModel:
        """The `chat.completion` object."""
        return ChatCompletionResponse(
            id=self.response_id,
            model=self.model,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=ChatResponseMessage(content=c.text),
                    logprobs=self._logprobs(c),
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                )
                for c in choices
            ],
            usage=usage,
            prompt_logprobs=self._prompt_logprobs(choices),
        )

    def _prompt_logprobs(self, choices: list[ChoiceUpdate]) -> PromptLogprobs | None:
        prompt = choices[0].prompt if choices else None
        if self.num_prompt_logprobs is None or prompt is None:
            return None
        return prompt_logprobs(
            self.token_text, prompt.token_ids, prompt.logprobs, self.num_prompt_logprobs
        )

    def _chunk(
        self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.response_id, model=self.model, choices=choices, usage=usage
        )

    def _logprobs(self, update: ChoiceUpdate) -> ChatLogprobs | None:
        if not self.with_logprobs:
            return None
        return chat_logprobs(
            self.token_text, update.token_ids, update.logprobs, update.num_logprobs
        )
