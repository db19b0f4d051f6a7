"""The chat template for requests with tools: which one, chosen once at start-up.

`tool_choice: "auto"` only works if the prompt shows the model its tools and how to call
them, and replays earlier calls and their results. Router setting `tool_chat_template`:

- `auto` (default): the model's own template when it renders `tools` (its source mentions
  them, or it has a named `tool_use` template), else the router's Hermes-style ChatML tool
  template (`templates/chatml_tools.jinja`) when the model's template is ChatML
  (`<|im_start|>`), else none;
- a path: that Jinja template file;
- `none`: no tool template ("auto" is then a 400 and the default tool_choice is "none").

The template and the parser go together: `tool_call_parser` must read the call format the
template asks the model for (the shipped template asks for `hermes`'s; a model's own tool
template must too, or be replaced by a file that does).

The tool template renders only requests that carry tools or tool-call history; every other
request renders with the model's own template exactly as before, so their prompts (and the
prefix cache hits between them) do not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).parent / "templates"
CHATML_TOOLS = SHIPPED_DIR / "chatml_tools.jinja"
CHATML_MARK = "<|im_start|>"


@dataclass(frozen=True)
class ToolTemplate:
    """The template that renders requests with tools, and the call format it asks for."""

    source: str  # "model" (the model's own template) or the file it was read from
    text: str | None  # the Jinja source; None = the model's own template
    parser: str  # the tool_call_parser that reads the calls this template asks for


def model_template_source(tokenizer: Any) -> str:
    """The model's chat template text, all named templates joined ("" if it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return str(template or "")


def renders_tools(tokenizer: Any) -> bool:
    """Whether the model's own template renders `tools` (how HF templates receive them)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict) and "tool_use" in template:
        return True
    return "tools" in model_template_source(tokenizer)


def resolve_tool_template(setting: str, tokenizer: Any, parser: str) -> ToolTemplate | None:
    """The tool template `setting` names for this tokenizer; ValueError if a file is unreadable."""
    if setting == "none":
        return None
    if setting == "auto":
        if renders_tools(tokenizer):
            return ToolTemplate("model", None, parser)
        if CHATML_MARK in model_template_source(tokenizer):
            return ToolTemplate(str(CHATML_TOOLS), CHATML_TOOLS.read_text(), parser)
        return None
    path = Path(setting)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"tool_chat_template {setting!r} cannot be read: {exc}") from exc
    if not text.strip():
        raise ValueError(f"tool_chat_template {setting!r} is empty")
    return ToolTemplate(str(path), text, parser)


def uses_tool_template(messages: list[dict[str, Any]], tools: list[Any] | None) -> bool:
    """A request renders with the tool template if it has tools or tool-call history."""
    return bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
