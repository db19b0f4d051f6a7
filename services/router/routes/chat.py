"""POST /v1/chat/completions: chat through the model's chat template, streaming or not."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    PromptLogprobs,
    ToolCall,
    UsageInfo,
)
from services.router.structured import check_spec
from services.router.token_text import TokenText
from services.router.tool_calls import (
    AutoCalls,
    CallDelta,
    ForcedCall,
    ToolCallParser,
    plan_tool_calls,
)
from services.router.tool_parsers import TOOL_CALL_PARSERS, AutoToolParser

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
    auto_format = TOOL_CALL_PARSERS[template.parser] if template is not None else None
    choice = body.tool_choice
    if choice is None and structured is not None:
        choice = "none"  # a structured output asked for: tools default to "none", as before
    call = plan_tool_calls(body.tools, choice, body.parallel_tool_calls, auto_format)
    if call is not None:
        if structured is not None:
            raise bad_request(f"{structured[0]} cannot be combined with tool calls", structured[0])
        structured = ("tools", call.spec)
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
        tool_call=call,
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
    # Tool calls the text becomes: a forced call's, or "auto"'s words and calls.
    tool_call: ForcedCall | AutoCalls | None = None
    _parsers: dict[int, ToolCallParser] = field(default_factory=dict)
    _auto_parsers: dict[int, AutoToolParser] = field(default_factory=dict)  # one per choice

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
                        finish_reason=self._finish_reason(
                            u.finish_reason,
                            self._parsers.get(u.index) or self._auto_parsers.get(u.index),
                        ),
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
                    message=self._message(c, parser),
                    logprobs=self._logprobs(c),
                    finish_reason=self._finish_reason(c.finish_reason, parser),
                    stop_reason=c.stop_reason,
                )
                for c, parser in zip(choices, self._whole_parsers(choices), strict=True)
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
        if self.tool_call is None:
            return DeltaMessage(content=update.text) if update.text else DeltaMessage()
        if isinstance(self.tool_call, AutoCalls):
            return self._auto_delta(update, self.tool_call)
        parser = self._parsers.setdefault(update.index, ToolCallParser(self.tool_call.name))
        calls = _delta_calls(parser.feed(update.text))
        return DeltaMessage(tool_calls=calls) if calls else DeltaMessage()

    def _auto_delta(self, update: ChoiceUpdate, auto: AutoCalls) -> DeltaMessage:
        """Words as content, calls as tool_calls; what could be a tag is held back."""
        parser = self._auto_parsers.get(update.index)
        if parser is None:
            parser = self._auto_parsers[update.index] = auto.format.new_parser()
        parsed = parser.feed(update.text)
        content, calls = parsed.content, _delta_calls(parsed.calls)
        if update.finish_reason is not None:
            content += parser.finish().content
        return DeltaMessage(content=content or None, tool_calls=calls or None)

    def _whole_parsers(
        self, choices: list[ChoiceUpdate]
    ) -> list[ToolCallParser | AutoToolParser | None]:
        if self.tool_call is None:
            return [None] * len(choices)
        parsers: list[ToolCallParser | AutoToolParser | None] = []
        for choice in choices:
            if isinstance(self.tool_call, AutoCalls):
                auto = self.tool_call.format.new_parser()
                auto.feed(choice.text)
                auto.finish()
                parsers.append(auto)
                continue
            parser = ToolCallParser(self.tool_call.name)
            parser.feed(choice.text)
            parsers.append(parser)
        return parsers

    def _message(
        self, choice: ChoiceUpdate, parser: ToolCallParser | AutoToolParser | None
    ) -> ChatResponseMessage:
        """The reply; a forced call's text as tool_calls (as text if it was cut short);
        "auto"'s words as content, its whole calls as tool_calls (an unfinished one as text)."""
        if parser is None:
            return ChatResponseMessage(content=choice.text)
        if isinstance(parser, ToolCallParser):
            if choice.finish_reason != "stop" or not parser.is_complete():
                return ChatResponseMessage(content=choice.text)
            return ChatResponseMessage(content=None, tool_calls=_tool_calls(parser.calls))
        calls = parser.complete_calls()
        content = parser.content + parser.unfinished_text()
        return ChatResponseMessage(
            content=content or (None if calls else ""), tool_calls=_tool_calls(calls)
        )

    def _finish_reason(
        self, reason: str | None, parser: ToolCallParser | AutoToolParser | None
    ) -> str | None:
        # The output stopped with whole calls (a forced call's grammar ended it, or "auto"
        # made at least one): OpenAI's "tool_calls".
        if reason != "stop" or parser is None:
            return reason
        if isinstance(parser, ToolCallParser):
            return "tool_calls" if parser.is_complete() else reason
        return "tool_calls" if parser.complete_calls() else reason

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
