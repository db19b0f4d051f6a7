"""Prompts in: tokenization, chat templates and the checks done before any routing."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from quire.model import checkpoint
from services.router.errors import bad_request
from services.router.tool_templates import ToolTemplate, uses_tool_template


@functools.cache
def load_tokenizer(model: str) -> Any:
    """The checkpoint's tokenizer (a directory's, or a GGUF file's), loaded once per process."""
    try:
        return checkpoint.load_tokenizer(model)
    except ValueError as exc:
        raise ValueError(f"QUIRE_MODEL / --model = {model!r}: {exc}") from exc


class PromptProcessor:
    """Turns OpenAI prompts and messages into token ids the executors accept."""

    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        vocab_size: int,
        tool_template: ToolTemplate | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # Renders requests with tools or tool history (None: the model's template renders
        # them, ignoring what it does not know, and "auto" tool choice is refused).
        self.tool_template = tool_template

    def completion_prompts(self, prompt: str | list[Any]) -> list[list[int]]:
        """One id list per prompt: a string, list of strings, ids, or list of id lists."""
        if isinstance(prompt, str):
            return [self._encode(prompt, "prompt")]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if all(isinstance(p, str) for p in prompt):
            return [self._encode(p, f"prompt.{i}") for i, p in enumerate(prompt)]
        if all(isinstance(p, int) for p in prompt):
            return [self._check_ids(prompt, "prompt")]
        if all(isinstance(p, list) for p in prompt):
            return [self._check_ids(p, f"prompt.{i}") for i, p in enumerate(prompt)]
        raise bad_request(
            "prompt must be a string, a list of strings, a list of token ids "
            "or a list of lists of token ids",
            "prompt",
        )

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Render the chat template (by default with the generation prompt) and tokenize it.

        A request with tools or tool-call history renders with the tool template, if the
        router has one; any other keeps the model's own template."""
        template = None
        if self.tool_template is not None and uses_tool_template(messages, tools):
            template = self.tool_template.text
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
            )
        except Exception as exc:  # jinja errors carry the template's own message
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from exc
        # The template already writes bos: no second one from the tokenizer.
        ids = list(self.tokenizer.encode(str(text), add_special_tokens=False))
        if not ids:
            raise bad_request("messages render to an empty prompt", "messages")
        return ids

    def check_context(self, prompt_ids: Sequence[int], max_tokens: int | None, param: str) -> int:
        """The max_tokens to use; 400 when the prompt plus max_tokens exceeds the context.

        `max_tokens=None` means "the rest of the context" (chat's default).
        """
        num_prompt = len(prompt_ids)
        if num_prompt >= self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, your prompt has {num_prompt} tokens and at least one must be "
                "left to generate. Please reduce the length of the prompt.",
                param,
                "context_length_exceeded",
            )
        if max_tokens is None:
            return self.max_model_len - num_prompt
        if num_prompt + max_tokens > self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {num_prompt + max_tokens} tokens ({num_prompt} in "
                f"the prompt, {max_tokens} in the completion). Please reduce the length of "
                "the prompt or completion.",
                param,
                "context_length_exceeded",
            )
        return max_tokens

    def _encode(self, text: str, param: str) -> list[int]:
        if not text:
            raise bad_request("prompt must not be empty", param)
        return list(self.tokenizer.encode(text))

    def _check_ids(self, ids: list[Any], param: str) -> list[int]:
        if not ids:
            raise bad_request("a token id prompt must not be empty", param)
        for token_id in ids:
            if (
                not isinstance(token_id, int)
                or isinstance(token_id, bool)
                or not 0 <= token_id < self.vocab_size
            ):
                raise bad_request(
                    f"token id {token_id!r} is not an integer in [0, {self.vocab_size})", param
                )
        return list(ids)
