"""The tool chat template: which one the router picks, what it renders for tools, past calls
and tool results, and that requests without tools render exactly as before."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.router.prompts import PromptProcessor, load_tokenizer
from services.router.schemas import ChatMessage
from services.router.tool_templates import CHATML_TOOLS, resolve_tool_template
from tests.services.router.test_structured import WEATHER_CALL_TURN

REPO = Path(__file__).resolve().parents[3]
SMOL = str(REPO / "models" / "smollm2-135m-instruct")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    WEATHER_CALL_TURN,
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]
EXPECTED = (
    "<|im_start|>system\n"
    "Be brief.\n\n"
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",'
    ' "properties": {"city": {"type": "string"}}}}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    '{"temp": 21}\n'
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smol() -> Any:
    return load_tokenizer(SMOL)


def processor(tokenizer: Any, setting: str = "auto") -> PromptProcessor:
    return PromptProcessor(
        tokenizer, 2048, 49152, resolve_tool_template(setting, tokenizer, "hermes")
    )


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> str:
    prompts = processor(tokenizer)
    ids = prompts.chat_prompt([ChatMessage(**m).for_template() for m in messages], tools)
    return str(tokenizer.decode(ids))


def test_auto_picks_the_chatml_tool_template_for_the_default_model(smol: Any) -> None:
    template = resolve_tool_template("auto", smol, "hermes")
    assert template is not None and template.source == str(CHATML_TOOLS)
    assert template.text == CHATML_TOOLS.read_text() and template.parser == "hermes"


def test_tools_history_and_tool_responses_render_hermes_style(smol: Any) -> None:
    assert render(smol, HISTORY, [WEATHER]) == EXPECTED


def test_several_tool_responses_share_one_user_turn(smol: Any) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
    ]
    assert render(smol, messages) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n"
        "<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("setting", ["auto", "none"])
def test_requests_without_tools_render_exactly_as_before(smol: Any, setting: str) -> None:
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
    for conversation in (messages, [{"role": "system", "content": "S"}, *messages]):
        before = smol.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        ids = processor(smol, setting).chat_prompt(conversation)
        assert ids == smol.encode(before, add_special_tokens=False)
        # The model's own template (its default system prompt), not the tool template.
        assert "SmolLM" in before or conversation[0]["role"] == "system"


def test_without_a_tool_template_tools_go_to_the_model_template(smol: Any) -> None:
    prompts = processor(smol, "none")
    assert prompts.tool_template is None
    ids = prompts.chat_prompt([{"role": "user", "content": "Hi"}], [WEATHER])
    assert "<tools>" not in smol.decode(ids)


def test_choice_of_template() -> None:
    chatml = SimpleNamespace(chat_template="{{ '<|im_start|>' + m }}")
    own = SimpleNamespace(chat_template="{% if tools %}{{ tools }}{% endif %}<|im_start|>")
    named = SimpleNamespace(chat_template={"default": "x", "tool_use": "y"})
    other = SimpleNamespace(chat_template="[INST] {{ m }} [/INST]")
    bare = SimpleNamespace(chat_template=None)
    shipped = resolve_tool_template("auto", chatml, "hermes")
    assert shipped is not None and shipped.source == str(CHATML_TOOLS)
    for tokenizer in (own, named):
        found = resolve_tool_template("auto", tokenizer, "hermes")
        assert found is not None and found.source == "model" and found.text is None
    assert resolve_tool_template("auto", other, "hermes") is None
    assert resolve_tool_template("auto", bare, "hermes") is None
    assert resolve_tool_template("none", own, "hermes") is None


def test_a_template_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    found = resolve_tool_template(str(path), SimpleNamespace(chat_template=None), "hermes")
    assert found is not None and found.text == path.read_text() and found.source == str(path)
    with pytest.raises(ValueError, match="cannot be read"):
        resolve_tool_template(str(tmp_path / "missing.jinja"), None, "hermes")


def test_settings_name_the_template_and_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from services.router.router_settings import RouterSettings

    defaults = RouterSettings()
    assert (defaults.tool_chat_template, defaults.tool_call_parser) == ("auto", "hermes")
    monkeypatch.setenv("QUIRE_TOOL_CHAT_TEMPLATE", "none")
    assert RouterSettings().tool_chat_template == "none"
    with pytest.raises(ValidationError, match="tool_call_parser must be one of"):
        RouterSettings(tool_call_parser="mistral")
