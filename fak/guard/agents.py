"""Which wire an agent speaks and how it is pointed at the guard: base-URL variables set in the
child's environment only (never the parent's, never a config file), and Codex's `-c` overrides for
a custom provider."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fak.errors import FakError

PROVIDERS = ("anthropic", "openai", "responses")
DEFAULT_UPSTREAM = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com",
                    "responses": "https://api.openai.com"}
_BY_AGENT = {"claude": "anthropic", "claude-code": "anthropic", "codex": "responses", "aider": "openai",
             "opencode": "openai"}
CODEX_PROVIDER = "fak_guard"
LOCAL_KEY = "fak-local"  # what an agent gets as its key when the model is in-kernel and it has none


def provider_for(argv: list[str], given: str | None) -> str:
    if given is not None:
        if given not in PROVIDERS:
            raise FakError(f"--provider {given!r}: expected one of {', '.join(PROVIDERS)}")
        return given
    return _BY_AGENT.get(os.path.basename(argv[0]).lower(), "anthropic")


def default_upstream(provider: str, env: dict[str, str]) -> str:
    """Where the agent would have gone without the guard: its base-URL variable, else the provider."""
    var = "ANTHROPIC_BASE_URL" if provider == "anthropic" else "OPENAI_BASE_URL"
    return env.get(var) or DEFAULT_UPSTREAM[provider]


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    set_vars: list[str] = field(default_factory=list)  # the variables the guard set (for the banner)


def launch(argv: list[str], provider: str, url: str, parent_env: dict[str, str], *, extra_vars: list[str] = (),
           local_model: bool = False) -> Launch:
    """The child's argv and environment for a guard listening at `url` (http://127.0.0.1:PORT)."""
    env = dict(parent_env)
    v1 = f"{url}/v1"
    if provider == "anthropic":
        sets = {"ANTHROPIC_BASE_URL": url}
        if local_model and not env.get("ANTHROPIC_API_KEY") and not env.get("ANTHROPIC_AUTH_TOKEN"):
            sets["ANTHROPIC_API_KEY"] = LOCAL_KEY
    else:
        sets = {"OPENAI_BASE_URL": v1, "OPENAI_API_BASE": v1}  # the SDK's name, and aider's / litellm's
        if local_model and not env.get("OPENAI_API_KEY"):
            sets["OPENAI_API_KEY"] = LOCAL_KEY
    for name in extra_vars:
        sets[name] = v1 if provider != "anthropic" else url
    env.update(sets)
    args = list(argv)
    if os.path.basename(args[0]).lower() == "codex":
        # Codex ignores OPENAI_BASE_URL for its built-in provider; a custom one is configured by -c
        # overrides (TOML values), global options placed before any subcommand
        wire_api = "responses" if provider == "responses" else "chat"
        key_var = "OPENAI_API_KEY"
        args[1:1] = ["-c", f"model_provider={CODEX_PROVIDER}",
                     "-c", f'model_providers.{CODEX_PROVIDER}.name="fak guard"',
                     "-c", f'model_providers.{CODEX_PROVIDER}.base_url="{v1}"',
                     "-c", f'model_providers.{CODEX_PROVIDER}.env_key="{key_var}"',
                     "-c", f'model_providers.{CODEX_PROVIDER}.wire_api="{wire_api}"']
    return Launch(args, env, sorted(sets))
