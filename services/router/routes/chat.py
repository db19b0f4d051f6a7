"""POST /v1/chat/completions: chat through the model's chat template, streaming or not."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from services.router.deps import StateDep
from services.router.errors import bad_request
from services.router.generation import ChoiceUpdate
from services.router.generation_response import build_params, new_id, serve_generation
from services.router.logprobs import chat_logprobs, prompt_logprobs
from services.router.schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    PromptLogprobs,
    ToolCall,
    UsageInfo,
)
from services.router.structured_fields import check_spec
from services.router.token_text import TokenText
from services.router.tool_calls import ToolCallPlan, plan_tool_calls
from services.router.tool_parsers.base import CallDelta, ExtractedToolCalls, ToolParser
from services.router.tool_parsers.registry import tool_parser_class

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: StateDep
) -> Response:
    """OpenAI's chat completions: messages in, `n` assistant replies out."""
    state.check_model(body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    structured = body.requested_structured()
    template = state.prompts.tool_template
    auto_parser = tool_parser_class(template.parser) if template is not None else None
    choice = body.tool_choice
    if choice is None and structured is not None:
        choice = "none"  # a structured output asked for: tools default to "none", as before
    plan = plan_tool_calls(body.tools, choice, body.parallel_tool_calls, auto_parser)
    if plan is not None:
        if structured is not None:
            raise bad_request(f"{structured[0]} cannot be combined with tool calls", structured[0])
        structured = ("tools", plan.spec)
    if structured is not None:
        check_spec(structured[1], structured[0])
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    prompt = state.prompts.chat_prompt([m.for_template() for m in body.messages], tools)
    requested = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "messages"
    max_tokens = state.prompts.check_context(prompt, requested, param)
    params = build_params(
        body,
        max_tokens,
        (body.top_logprobs or 0) if body.logprobs else None,
        state.prompts.vocab_size,
    )
    if structured is not None:
        params.structured = structured[1]
    response_id = new_id("chatcmpl")
    shape = ChatShape(
        state.token_text,
        response_id,
        state.settings.model_name,
        body.logprobs,
        num_prompt_logprobs=body.prompt_logprobs,
        tool_calls=plan,
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
    # The tool calls the text becomes: the format that reads each choice, or None.
    tool_calls: ToolCallPlan | None = None
    _parsers: dict[int, ToolParser] = field(default_factory=dict)  # one per streamed choice

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
                        delta=self._delta(u),
                        logprobs=self._logprobs(u),
                        finish_reason=self._streamed_finish_reason(u),
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
                    message=self._message(c, calls),
                    logprobs=self._logprobs(c),
                    finish_reason=self._finish_reason(c.finish_reason, calls),
                    stop_reason=c.stop_reason,
                )
                for c, calls in ((c, self._extract(c)) for c in choices)
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

    def _delta(self, update: ChoiceUpdate) -> DeltaMessage:
        """Words as content, calls as tool_calls; what could still be a call is held back."""
        if self.tool_calls is None:
            return DeltaMessage(content=update.text) if update.text else DeltaMessage()
        parser = self._parsers.get(update.index)
        if parser is None:
            parser = self._parsers[update.index] = self.tool_calls.new_parser()
        parsed = parser.feed(update.text)
        content, calls = parsed.content, _delta_calls(parsed.calls)
        if update.finish_reason is not None:
            end = parser.finish(update.finish_reason == "stop")
            content, calls = content + end.content, calls + _delta_calls(end.calls)
        return DeltaMessage(content=content or None, tool_calls=calls or None)

    def _extract(self, choice: ChoiceUpdate) -> ExtractedToolCalls | None:
        if self.tool_calls is None:
            return None
        return self.tool_calls.new_parser().extract(choice.text, choice.finish_reason == "stop")

    def _message(
        self, choice: ChoiceUpdate, calls: ExtractedToolCalls | None
    ) -> ChatResponseMessage:
        """The reply: words as content, whole calls as tool_calls (the raw text of a call that
        was cut short stays content)."""
        if calls is None:
            return ChatResponseMessage(content=choice.text)
        return ChatResponseMessage(
            content=calls.content or (None if calls.tools_called else ""),
            tool_calls=_tool_calls(calls.calls),
        )

    def _streamed_finish_reason(self, update: ChoiceUpdate) -> str | None:
        parser = self._parsers.get(update.index)
        if update.finish_reason != "stop" or parser is None:
            return update.finish_reason
        return self._finish_reason(update.finish_reason, parser.extracted())

    def _finish_reason(self, reason: str | None, calls: ExtractedToolCalls | None) -> str | None:
        # The output stopped with whole calls (a forced call's grammar ended it, or "auto"
        # made at least one): OpenAI's "tool_calls".
        if reason == "stop" and calls is not None and calls.tools_called:
            return "tool_calls"
        return reason

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


def _delta_calls(deltas: list[CallDelta]) -> list[DeltaToolCall]:
    return [
        DeltaToolCall(
            index=d.index,
            id=d.id,
            type="function" if d.id else None,
            function=DeltaFunctionCall(name=d.name, arguments=d.arguments),
        )
        for d in deltas
    ]


def _tool_calls(calls: list[CallDelta]) -> list[ToolCall]:
    return [
        ToolCall(id=c.id or "", function=FunctionCall(name=c.name or "", arguments=c.arguments))
        for c in calls
    ]
