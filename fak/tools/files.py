"""Read, Write, Edit in Claude Code's argument shapes, on paths confined to the root."""

from __future__ import annotations

from typing import Any

from fak.tools.confine import Root, ToolError, need_int, need_str

READ_LIMIT = 2000  # lines, when the call gives no limit (Claude Code's default)
MAX_LINE = 2000  # characters per line shown; longer lines are cut
MAX_READ_BYTES = 256 * 1024  # a file bigger than this is read in ranges (offset/limit), not whole


def _text(path_bytes: bytes, shown: str) -> str:
    if b"\x00" in path_bytes[:8192]:
        raise ToolError(f"{shown}: a binary file")
    return path_bytes.decode("utf-8", "replace")


def read(root: Root, args: dict[str, Any]) -> str:
    """`{"file_path", "offset"?, "limit"?}`: lines numbered like `cat -n` (offset is the first line, 1-based)."""
    given = need_str(args, "file_path") or ""
    p = root.resolve(given)
    if not p.exists():
        raise ToolError(f"{given}: no such file")
    if p.is_dir():
        raise ToolError(f"{given}: a directory (use Glob or Bash ls)")
    offset = need_int(args, "offset", minimum=0) or 1
    limit = need_int(args, "limit", minimum=1) or READ_LIMIT
    data = p.read_bytes()
    if len(data) > MAX_READ_BYTES and "limit" not in args:
        raise ToolError(f"{given}: {len(data)} bytes; read it in ranges with offset and limit")
    lines = _text(data, given).splitlines()
    if not lines:
        return f"({given} is empty)"
    if offset > len(lines):
        raise ToolError(f"{given}: offset {offset} is past the end ({len(lines)} lines)")
    out = []
    for n, line in enumerate(lines[offset - 1 : offset - 1 + limit], start=offset):
        out.append(f"{n:6d}\t{line[:MAX_LINE]}")
    last = offset - 1 + limit
    if last < len(lines):
        out.append(f"... ({len(lines) - last} more lines; read on with offset {last + 1})")
    return "\n".join(out)


def write(root: Root, args: dict[str, Any]) -> str:
    """`{"file_path", "content"}`: create or overwrite the file (parent directories made)."""
    given = need_str(args, "file_path") or ""
    content = need_str(args, "content")
    assert content is not None
    p = root.resolve(given)
    if p.is_dir():
        raise ToolError(f"{given}: a directory")
    p.parent.mkdir(parents=True, exist_ok=True)
    existed = p.exists()
    p.write_text(content, encoding="utf-8")
    return f"{'Overwrote' if existed else 'Created'} {root.rel(p)} ({len(content.encode())} bytes)"


def edit(root: Root, args: dict[str, Any]) -> str:
    """`{"file_path", "old_string", "new_string", "replace_all"?}`: replace an exact string, which must
    occur once unless replace_all."""
    given = need_str(args, "file_path") or ""
    old, new = need_str(args, "old_string"), need_str(args, "new_string")
    assert old is not None and new is not None
    replace_all = args.get("replace_all", False)
    if not isinstance(replace_all, bool):
        raise ToolError(f"argument 'replace_all': expected true or false, got {replace_all!r}")
    if old == new:
        raise ToolError("old_string and new_string are the same")
    p = root.resolve(given)
    if not p.is_file():
        raise ToolError(f"{given}: no such file")
    text = _text(p.read_bytes(), given)
    if old == "":
        raise ToolError("old_string is empty (use Write to create a file)")
    n = text.count(old)
    if n == 0:
        raise ToolError(f"{given}: old_string not found")
    if n > 1 and not replace_all:
        raise ToolError(f"{given}: old_string occurs {n} times; give more context or set replace_all")
    p.write_text(text.replace(old, new) if replace_all else text.replace(old, new, 1), encoding="utf-8")
    return f"Edited {root.rel(p)} ({n if replace_all else 1} replacement{'s' if replace_all and n > 1 else ''})"
