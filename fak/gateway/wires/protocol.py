"""Request bodies of every wire (OpenAI, Anthropic Messages, Responses, fak) as pydantic models: the 400s
come from validation.

Unknown fields are refused (extra="forbid"), so nothing a client sends is silently ignored. Fields
the SDKs send that fak does not implement yet are accepted only at their no-op value
(`unsupported()` names the first one set otherwise).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatMessage(_Body):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id ... ride along to the template
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class FunctionDef(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema for the arguments
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: dict[str, str]


# no-op values of the fields not implemented yet (a different value would change the output)
_NOOP: dict[str, Any] = {"echo": (None, False), "best_of": (None, 1), "suffix": (None, "")}


class _Sampling(_Body):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # also narrows the prefix-cache share scope (fak.gateway.generation)
    cache_salt: str | None = Field(None, min_length=1)  # vLLM's: prefix-cache blocks shared only within one salt
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, ge=0.01, le=10.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's shape) -> bias
    min_p: float = Field(0.0, ge=0.0, le=1.0)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def unsupported(self) -> str | None:
        """The first field set to a value that would change the output but is not implemented yet."""
        for name, noop in _NOOP.items():
            if name in self.model_fields_set and getattr(self, name, None) not in noop:
                return name
        return None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def logprob_k(self) -> int | None:
        """How many alternatives per token (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    def logprob_k(self) -> int | None:
        return self.logprobs


class EmbeddingRequest(_Body):
    # one text, several, one token-id list or several (OpenAI's four shapes)
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# -- the Anthropic Messages wire (wires/anthropic.py)
class AnthropicTool(_Body):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    defer_loading: bool | None = None  # offered, but not in the prompt until the client loads it (tool search)


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicMessage(_Body):
    role: Literal["user", "assistant", "system"]  # Claude Code puts system reminders among the messages
    content: str | list[dict[str, Any]]
    output_config: dict[str, Any] | None = None  # per-message effort (Claude Code): no reasoning budget here


class MessagesRequest(_Body):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    container: Any | None = None
    # accepted, no effect on the output here
    context_management: dict[str, Any] | None = None  # server-side context edits: a short context needs none
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    cache_control: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    cache_salt: str | None = Field(None, min_length=1)  # not Anthropic's: vLLM's prefix-cache scope, as on the other wires


class CountTokensRequest(_Body):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict[str, Any] | None = None


# -- the OpenAI Responses wire (wires/responses.py)
class ResponsesTool(BaseModel):
    model_config = ConfigDict(extra="allow")  # `strict` and the like ride along
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stream: bool = False
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # refused when set: they need server-side state or features not here
    previous_response_id: str | None = None
    conversation: Any | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None
    # accepted, no effect on the output here
    store: bool | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    stream_options: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    context_management: Any | None = None
    moderation: Any | None = None
    access_programs: Any | None = None
    image: Any | None = None
    client_metadata: dict[str, Any] | None = None  # Codex's session and turn ids
    cache_salt: str | None = Field(None, min_length=1)  # vLLM's: prefix-cache blocks shared only within one salt


# -- fak's own routes (wires/fak.py)
class SyscallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] | str = Field(default_factory=dict)  # an object, or its JSON text
    trace_id: str | None = None
