"""The request's tools and `tool_choice`, as OpenAI defines them (chat's function calling).

The lowest of the tool-call modules: the request schemas, the plan (`tool_calls`) and every
call format (`tool_parsers`) read these types, and they import nothing of the router.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None = no arguments
    strict: bool | None = None

    @property
    def arguments_schema(self) -> dict[str, Any]:
        """The JSON schema a call's `arguments` object is generated under."""
        return self.parameters or NO_ARGUMENTS


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
