"""The built-in tool set (Read, Glob, Grep, Write, Edit, Bash) confined to one working directory, as the
`sandbox` engine. Exports SandboxTools, TOOL_SPECS, TOOL_NAMES, ToolError."""

from fak.tools.confine import ToolError
from fak.tools.sandbox import SandboxTools
from fak.tools.specs import TOOL_NAMES, TOOL_SPECS, specs_for

__all__ = ["TOOL_NAMES", "TOOL_SPECS", "SandboxTools", "ToolError", "specs_for"]
