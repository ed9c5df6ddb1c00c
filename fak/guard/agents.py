"""Which wire an agent speaks and how it is pointed at the guard: base-URL variables set in the
child's environment only (never the parent's, never a config file), and Codex's `-c` overrides for
a custom provider."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

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


# the agent's own state, relative to its HOME: writable inside the sandbox. The first (its state directory)
# is made if missing, so that it can be bound; the others are bound when they exist. Any other agent gets
# its project only.
STATE: dict[str, tuple[str, ...]] = {
    "claude": (".claude/", ".claude.json", ".claude.json.backup", ".config/claude/"),
    "codex": (".codex/",),
    "aider": (".aider/", ".aider.chat.history.md", ".aider.input.history"),
    "opencode": (".local/share/opencode/", ".config/opencode/", ".local/state/opencode/"),
}
STATE["claude-code"] = STATE["claude"]


def state_paths(argv: list[str], env: dict[str, str]) -> tuple[Path, ...]:
    """The running agent's own state under its HOME (and CODEX_HOME / CLAUDE_CONFIG_DIR when set)."""
    name = os.path.basename(argv[0]).lower()
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    out = []
    for i, rel in enumerate(STATE.get(name, ())):
        p = home / rel
        if i == 0:
            p.mkdir(parents=True, exist_ok=True)
        out.append(p)
    for var in ("CODEX_HOME", "CLAUDE_CONFIG_DIR"):
        if env.get(var) and name.startswith(var.split("_")[0].lower()):  # CODEX_HOME for codex, ...
            p = Path(env[var])
            p.mkdir(parents=True, exist_ok=True)
            out.append(p)
    return tuple(out)


def default_upstream(provider: str, env: dict[str, str]) -> str:
    """Where the agent would have gone without the guard: its base-URL variable, else the provider."""
    var = "ANTHROPIC_BASE_URL" if provider == "anthropic" else "OPENAI_BASE_URL"
    return env.get(var) or DEFAULT_UPSTREAM[provider]


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    set_vars: list[str] = field(default_factory=list)  # the variables the guard set (for the banner)


def _codex_own_sandbox(args: list[str]) -> str | None:
    """The sandbox mode a Codex command line asks for itself (-s MODE, --sandbox MODE, --full-auto)."""
    for i, a in enumerate(args):
        if a in ("-s", "--sandbox") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--sandbox="):
            return a.split("=", 1)[1]
        if a == "--full-auto":
            return "workspace-write"
    return None


def launch(argv: list[str], provider: str, url: str, parent_env: dict[str, str], *, extra_vars: list[str] = (),
           local_model: bool = False, sandboxed: bool = False) -> Launch:
    """The child's argv and environment for a guard listening at `url` (http://127.0.0.1:PORT).
    `sandboxed`: the agent runs inside fak's sandbox, which replaces Codex's own (a bubblewrap inside
    another cannot set up its namespaces, so every command Codex ran under its own would fail)."""
    env = dict(parent_env)
    v1 = f"{url}/v1"
    if provider == "anthropic":
        sets = {"ANTHROPIC_BASE_URL": url}
        if local_model and not env.get("ANTHROPIC_API_KEY") and not env.get("ANTHROPIC_AUTH_TOKEN"):
            sets["ANTHROPIC_API_KEY"] = LOCAL_KEY
        if local_model and "CLAUDE_CODE_ATTRIBUTION_HEADER" not in env:
            # Claude Code opens its system prompt with a billing line that changes every session; for the
            # in-kernel model it bills nothing and would make every session's 11k-token prompt new from
            # its first tokens (no prefix to reuse, in memory or on disk)
            sets["CLAUDE_CODE_ATTRIBUTION_HEADER"] = "0"
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
        if sandboxed:
            own = _codex_own_sandbox(argv[1:])
            if own not in (None, "danger-full-access"):
                raise FakError(f"fak guard --sandbox on: codex's own sandbox ({own}) cannot run inside fak's (a "
                               "bubblewrap does not nest); drop that flag (fak's sandbox replaces it) or pass --sandbox off")
            if own is None:
                args[1:1] = ["-c", 'sandbox_mode="danger-full-access"']
    return Launch(args, env, sorted(sets))
