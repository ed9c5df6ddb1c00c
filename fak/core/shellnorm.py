"""A lexical normal form of shell text, for policy rules with `"normalize": "shell"`.

`shell_normalize(text)` undoes the cheap ways of hiding a command word from a regex, without running
anything and without a shell parser: the result is only ever *matched against*, never executed, so it
may over-approximate (a benign command can normalize into something a rule dislikes; a rule sees the
raw text and this form, and denies if either matches). In order:

  1. line continuations (backslash-newline) are joined;
  2. ANSI-C strings `$'\\x72\\x6d'` are decoded (\\xHH, \\NNN octal, \\uHHHH);
  3. trivial command substitutions are replaced by what they print: `$(echo rm)`, `` `printf %s rm` ``
     (escapes decoded), `$(which rm)`, `$(command -v rm)` -> `rm`;
  4. `${IFS}`, `$IFS` -> a space; `$@`, `$*`, `${@}`, `$1`..`$9` (usually empty) -> nothing;
  5. variables assigned a literal or another variable in the same text (`c=rm; $c -rf ~`,
     `X=$HOME; rm -rf $X`, `env X=rm sh -c '$X ...'`) are substituted, quotes of the value removed
     (last assignment wins, one pass);
  6. a word that is a brace list `{rm,-rf,~}` becomes its words;
  7. backslash escapes `\\r` -> `r`; quote characters are dropped (`r''m`, `"r"m`, `'rm'` -> `rm`);
  8. absolute paths to binaries lose their directory (`/usr/bin/rm`, `/bin/sh`, `/opt/x/sbin/y` ->
     `rm`, `sh`, `y`).

Text without any of the trigger characters ( ' " \\ $ ` { / ) is returned as is (the same object).
"""

from __future__ import annotations

import re

_TRIGGERS = re.compile(r"['\"\\$`{/]")
_ANSI_C = re.compile(r"\$'((?:[^'\\]|\\.)*)'", re.S)
_ESC = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{4}|[0-7]{1,3}|.)", re.S)
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "f": "\f", "v": "\v"}
# $(echo ...) / `echo ...` / $(printf ...) whose body has no further expansion or nesting
_PRINT_SUB = re.compile(r"\$\(\s*(echo|printf)((?:\s[^()`$;&|<>]*)?)\)|`\s*(echo|printf)((?:\s[^()`$;&|<>]*)?)`")
_WHICH_SUB = re.compile(r"\$\(\s*(?:which|command\s+-v|type\s+-P)\s+([\w.+-]+)\s*\)"
                        r"|`\s*(?:which|command\s+-v|type\s+-P)\s+([\w.+-]+)\s*`")
_IFS = re.compile(r"\$\{IFS\}|\$IFS\b")
_POSITIONAL = re.compile(r"\$\{[@*]\}|\$[@*1-9]")
_ASSIGN = re.compile(r"(?<![^\s;&|(`])([A-Za-z_]\w*)="
                     r"('[^']*'|\"[^\"`$\\]*\"|\"?\$\{?\w+\}?\"?|[^\s;&|()<>'\"`$\\]*)(?=[\s;&|)]|$)")
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")
_BRACE = re.compile(r"(?<![^\s;&|(`])\{([^{}\s,]*(?:,[^{}\s,]*)+)\}(?=[\s;&|)]|$)")
_BACKSLASH = re.compile(r"\\(.)", re.S)
_BINPATH = re.compile(r"(?<![^\s;&|(`=<>])(?:/[\w.+-]+)*/s?bin/(?=[\w.+-])")
_ECHO_FLAGS = re.compile(r"^(?:\s*-[neE]+\b)+")


def unescape(s: str) -> str:
    """Backslash escapes as bash's $'...' decodes them (\\xHH, \\NNN octal, \\uHHHH, \\n ...)."""
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xu" and len(e) > 1:
            return chr(int(e[1:], 16))
        if e[0] in "01234567":
            return chr(int(e, 8) & 0xFF)
        return _SIMPLE.get(e, e)

    return _ESC.sub(one, s) if "\\" in s else s


def _printed(m: re.Match[str]) -> str:
    cmd, body = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    body = (body or "").strip()
    if cmd == "echo":
        body = _ECHO_FLAGS.sub("", body).strip()
    else:  # printf: a leading %s-only format prints its arguments
        body = re.sub(r"^(['\"]?)(?:%s)+\1(?:\s+|$)", "", body)
    return unescape(body.replace("'", "").replace('"', ""))


def shell_normalize(text: str) -> str:
    if _TRIGGERS.search(text) is None:
        return text
    s = text.replace("\\\n", "")
    if "$'" in s:
        s = _ANSI_C.sub(lambda m: unescape(m.group(1)), s)
    if "$(" in s or "`" in s:
        s = _PRINT_SUB.sub(_printed, s)
        s = _WHICH_SUB.sub(lambda m: m.group(1) or m.group(2), s)
    if "$" in s:
        s = _IFS.sub(" ", s)
        s = _POSITIONAL.sub("", s)
        if "=" in s:
            vals = {m.group(1): m.group(2).strip("'\"") for m in _ASSIGN.finditer(s)}
            if vals:
                s = _VAR.sub(lambda m: vals.get(m.group(1) or m.group(2), m.group(0)), s)
    if "{" in s:
        s = _BRACE.sub(lambda m: m.group(1).replace(",", " "), s)
    if "\\" in s:
        s = _BACKSLASH.sub(r"\1", s)
    if "'" in s or '"' in s:
        s = s.replace("'", "").replace('"', "")
    if "bin/" in s:
        s = _BINPATH.sub("", s)
    return s
