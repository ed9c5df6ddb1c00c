"""Shell text -> simple commands, with a real parser (tree-sitter-bash).

tree-sitter-bash was chosen over bashlex by measurement (bench/decide.py --parsers): ~5 µs against ~200 µs
per command, and bashlex rejects `[[ ]]`, arrays and `case` (a quarter of a sample of agent commands),
where tree-sitter parses everything and marks what it cannot as ERROR nodes (which fail closed here).

The walk evaluates words as far as the text allows: quotes removed, `$'..'` decoded, variables assigned
earlier in the same text substituted (`c=rm; $c -rf ~`), `$HOME`, `${HOME:?}`, `$USER`, `$PWD`, `~`,
brace lists expanded, `for x in WORDS` binding x to every word, `cd` followed. What it cannot know (a
variable set at run time, a command's output) is the UNKNOWN character, so the effect model can still
classify `$HOME/$X` by its known prefix. A secret-looking variable (`$AWS_SECRET_ACCESS_KEY`) expands to
SECRET + its name, so sending it is visible.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field

import tree_sitter as ts
import tree_sitter_bash as tsb

from fak.core.shell.targets import UNKNOWN, Where, resolve
from fak.core.shellnorm import unescape as ansi_c

SECRET = "\x01"  # marks an expansion of a secret-looking variable: SECRET + name + UNKNOWN
# What an unknown command output is made of, after its UNKNOWN: a download, decoded text, a local tool's output
NET, DECODED, LOCAL = "\x02", "\x03", "\x04"
_NET_CMDS = frozenset({"curl", "wget", "fetch", "http", "https", "xh", "aria2c", "wget2", "curlie", "axel", "nc", "ncat",
                       "socat", "telnet", "ssh", "scp", "lynx", "links", "w3m"})
_DECODE_CMDS = frozenset({"base64", "base32", "basenc", "xxd", "uudecode", "rev", "openssl", "gunzip", "zcat", "gzip",
                          "xz", "bzip2", "tr", "perl", "python", "python3", "ruby", "node", "printf", "echo", "cat", "dd"})
# $PYTHON, $PIP ... in command position are those tools
TOOL_VARS = frozenset({"PYTHON", "PIP", "EDITOR", "VISUAL", "CC", "CXX", "MAKE", "NODE", "NPM", "GO", "CARGO", "JAVA",
                       "DOCKER", "PAGER", "RUSTC", "RUBY", "PERL", "UV", "POETRY", "PYTEST", "GIT", "YARN", "PNPM",
                       "GRADLE", "MVN", "CMAKE", "NINJA", "LD", "AR", "FC", "KUBECTL", "HELM", "TERRAFORM"})
_LANG = ts.Language(tsb.language())
_PARSER = ts.Parser(_LANG)
_MAX_ALTS = 32  # words with more alternatives (brace lists, loops) keep the first ones
_SECRET_VAR = re.compile(r"(?:^|_)(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|AUTH|PAT)(?:_|$)|^AWS_"
                         r"|^(?:GH|GITHUB|GITLAB|HF|NPM|PYPI|OPENAI|ANTHROPIC|CLAUDE)_", re.I)
_BRACE_WORDS = re.compile(r"\{[^{}\s]*,[^{}\s]*\}")
_UNQUOTED = frozenset({"concatenation", "simple_expansion", "expansion", "command_substitution", "word"})
_OP_NOISE = re.compile(r"[0-9\s]")
_PRINTERS = frozenset({"echo", "printf"})
_BACKSLASH = re.compile(r"\\(.)", re.S)
# Nodes that are a command's argument words (besides plain `word`, handled first)
_ARG_NODES = frozenset({"string", "raw_string", "concatenation", "simple_expansion", "expansion", "command_substitution",
                        "process_substitution", "number", "ansi_c_string", "arithmetic_expansion", "translated_string",
                        "brace_expression"})
_ARRAY_ALL = re.compile(r'"?\$\{(\w+)\[[@*]\]\}"?')
_DQ_ESC = re.compile(r'\\([$`"\\\n])')


class ShellParseError(ValueError):
    """The text is not shell the parser understands; the caller fails closed."""


Word = tuple[str, ...]  # the alternatives a word can expand to (one, usually)


@dataclass(slots=True)
class Redirect:
    op: str  # >, >>, <, &>, >&, <<<, <<
    target: Word
    fd: str = ""


@dataclass(slots=True)
class Cmd:
    """One simple command: its words, redirects, the working directory it runs in, and its pipeline."""

    argv: list[Word]
    where: Where
    redirects: list[Redirect] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # NAME=value prefixes
    stdin: Cmd | None = None  # the command piped into this one
    stdout: Cmd | None = None  # the command this one pipes into
    heredoc: str | None = None  # text fed on stdin by << or <<<
    pipeline: list[Cmd] = field(default_factory=list)  # every command of its pipeline, itself included
    dynamic_name: bool = False  # the command word itself is not known


class Walker:
    """Walks one parsed script, in order, keeping the variables and the working directory it sets."""

    def __init__(self, where: Where, vars: dict[str, Word] | None = None, depth: int = 0) -> None:
        self.where = where
        self.depth = depth
        self.vars: dict[str, Word] = {
            "HOME": (where.home,), "USER": (where.user,), "LOGNAME": (where.user,), "PWD": (where.cwd,),
            "TMPDIR": (where.tmp,), "SHELL": ("/bin/bash",), "OLDPWD": (where.cwd,),
            "PATH": ("/usr/local/bin:/usr/bin:/bin",),
        }
        self.vars.update({k: (v,) for k, v in where.env.items()})
        if vars:
            self.vars.update(vars)
        self.arrays: dict[str, list[str]] = {}  # a=(x y z): "${a[@]}" is its words
        self.cmds: list[Cmd] = []
        self.opaque: list[str] = []  # constructs that hide a command (${!x}, eval of a variable)

    # -- words ---------------------------------------------------------------------------------
    def word(self, n: ts.Node) -> Word:
        t = n.type
        if t == "word":
            s = n.text.decode("utf-8", "replace")
            if "\\" in s:
                s = _BACKSLASH.sub(r"\1", s)
            return (s,)
        if t == "raw_string":
            return (n.text.decode("utf-8", "replace")[1:-1],)
        if t == "ansi_c_string":
            return (ansi_c(n.text.decode("utf-8", "replace")[2:-1]),)
        if t in ("number", "string_content", "special_character", "regex", "extglob_pattern", "test_operator"):
            return (n.text.decode("utf-8", "replace"),)
        if t == "string":
            parts = [c for c in n.children if c.type not in ('"',)]
            if not parts:
                return ("",)
            return self._concat(parts, raw_gaps=n)
        if t == "concatenation":
            return self._concat(list(n.children))
        if t in ("simple_expansion", "expansion"):
            return self._expand(n)
        if t == "command_substitution":
            return self._substitute(n)
        if t == "process_substitution":
            before = len(self.cmds)
            self.walk(n)
            return ("/dev/fd/63" + _origin(self.cmds[before:]),)
        if t == "arithmetic_expansion":
            return ("0",)
        if t == "translated_string":
            return self.word(n.children[-1])
        if t == "brace_expression":
            txt = n.text.decode()
            m = re.fullmatch(r"\{(-?\d+)\.\.(-?\d+)\}", txt)
            if m:
                a, b = int(m.group(1)), int(m.group(2))
                step = 1 if b >= a else -1
                return tuple(str(i) for i in range(a, b + step, step))[:_MAX_ALTS]
            return (txt,)
        return (n.text.decode("utf-8", "replace"),)

    def _concat(self, parts: list[ts.Node], raw_gaps: ts.Node | None = None) -> Word:
        # A brace list {a,b,c} appears as the words "{", "a,b,c", "}" inside a concatenation.
        alts: list[str] = [""]
        i = 0
        prev_end = raw_gaps.start_byte + 1 if raw_gaps is not None else None
        src = raw_gaps.text if raw_gaps is not None else None
        while i < len(parts):
            c = parts[i]
            if raw_gaps is not None and prev_end is not None and c.start_byte > prev_end:  # text the grammar skips
                gap = src[prev_end - raw_gaps.start_byte:c.start_byte - raw_gaps.start_byte].decode("utf-8", "replace")
                alts = [a + _dq_unescape(gap) for a in alts]
            if (raw_gaps is None and c.type == "word" and c.text == b"{" and i + 2 < len(parts)
                    and parts[i + 2].type == "word" and parts[i + 2].text == b"}" and b"," in parts[i + 1].text):
                opts = tuple(parts[i + 1].text.decode().split(","))
                i += 3
                alts = [a + o for a in alts for o in opts][:_MAX_ALTS]
                prev_end = parts[i - 1].end_byte
                continue
            if raw_gaps is not None and c.type == "string_content":  # inside "...": \$ \` \" \\ are escapes
                w = (_dq_unescape(c.text.decode("utf-8", "replace")),)
            else:
                w = self.word(c)
            alts = [a + o for a in alts for o in w][:_MAX_ALTS]
            prev_end = c.end_byte
            i += 1
        if raw_gaps is not None and prev_end is not None and prev_end < raw_gaps.end_byte - 1:
            gap = src[prev_end - raw_gaps.start_byte:len(src) - 1].decode("utf-8", "replace")
            alts = [a + _dq_unescape(gap) for a in alts]
        return tuple(alts)

    def _expand(self, n: ts.Node) -> Word:
        names = [c for c in n.children if c.type in ("variable_name", "special_variable_name", "subscript")]
        txt = n.text.decode("utf-8", "replace")
        if txt.startswith("${!"):
            self.opaque.append(txt)
            return (UNKNOWN,)
        if txt.startswith("${#"):
            return ("0",)
        if not names:
            return (UNKNOWN,)
        nm = names[0]
        if nm.type == "subscript":
            nm = nm.children[0]
        name = nm.text.decode()
        if name == "IFS":
            return (self._ifs()[0],)
        if name in ("@", "*") or name.isdigit():
            return (UNKNOWN,)
        val = self.vars.get(name)
        m = re.fullmatch(r"\$\{\w+:(-?\d+)(?::(\d+))?\}", txt)
        if val is not None and m:  # ${PATH:0:1}
            a = int(m.group(1))
            return tuple(v[a:a + int(m.group(2))] if m.group(2) else v[a:] for v in val)
        if val is None:
            # ${X:-default} / ${X-default}: the default when X is not known here
            ops = [c for c in n.children if c.type in (":-", "-", ":=", "=")]
            if ops:
                rest = [c for c in n.children if c.start_byte >= ops[0].end_byte and c.type != "}"]
                if rest:
                    return self._concat(rest)
            if _SECRET_VAR.search(name):
                return (SECRET + name + UNKNOWN,)
            return (UNKNOWN,)
        return val

    def _substitute(self, n: ts.Node) -> Word:
        """$(cmd) / `cmd`: what a few printing commands print; the commands are walked either way."""
        before = len(self.cmds)
        self.walk(n)
        inner = self.cmds[before:]
        return self._printed(inner) or (UNKNOWN + _origin(inner),)

    def _printed(self, inner: list[Cmd]) -> Word | None:
        if len(inner) == 2 and inner[1].stdin is inner[0] and not inner[1].redirects:
            decoded = static_decode(inner[1])  # $(echo TEXT | base64 -d): what it prints
            return (decoded.rstrip("\n"),) if decoded is not None else None
        if len(inner) == 1 and not inner[0].redirects:
            argv = inner[0].argv
            name = argv[0][0] if argv and argv[0] else ""
            if name in _PRINTERS and len(argv) >= 1:
                words = [w[0] for w in argv[1:]]
                if name == "echo":
                    while words and re.fullmatch(r"-[neE]+", words[0]):
                        words.pop(0)
                    return (" ".join(words),)
                if words and re.fullmatch(r"(?:%s)+\\?n?", words[0]):
                    return ("".join(words[1:]),)
                return (ansi_c(words[0]) if words else "",)
            if name in ("which", "command", "type") and len(argv) >= 2:
                return (argv[-1][0],)
            if name == "pwd":
                return (inner[0].where.cwd,)
            if name in ("whoami", "id"):
                return (self.where.user,)
            if name == "git" and [w[0] for w in argv[1:3]] == ["rev-parse", "--show-toplevel"]:
                return (self.where.project,)
            if name == "mktemp":
                return (self.where.tmp + "/tmp." + UNKNOWN,)
            if name in ("realpath", "readlink") and len(argv) >= 2:
                return (resolve(argv[-1][0], inner[0].where),)
            if name == "dirname" and len(argv) >= 2:
                return (argv[-1][0].rsplit("/", 1)[0] or "/",)
        return None

    # -- statements ----------------------------------------------------------------------------
    def walk(self, n: ts.Node) -> None:
        for c in n.children:
            self.statement(c)

    def statement(self, n: ts.Node, stdin: Cmd | None = None) -> list[Cmd]:
        t = n.type
        if t == "command":
            return [self.command(n, stdin)]
        if t == "pipeline":
            return self.pipeline(n, stdin)
        if t == "redirected_statement":
            return self.redirected(n, stdin)
        if t == "variable_assignment":
            self.assign(n)
            return []
        if t == "variable_assignments":
            for c in n.children:
                if c.type == "variable_assignment":
                    self.assign(c)
            return []
        if t in ("declaration_command", "unset_command"):  # export/declare/local/readonly, unset: commands too
            argv: list[Word] = [(n.children[0].text.decode(),)] if n.children else []
            for c in n.children[1:]:
                if c.type == "variable_assignment":
                    self.assign(c)
                    node = c.child_by_field_name("name")
                    key = node.text.decode() if node is not None else ""
                    argv.append((key + "=" + self.vars.get(key, ("",))[0],))
                elif c.type != "comment":
                    argv.append(self.word(c))
            return [self.emit(Cmd(argv, self.where, stdin=stdin))]
        if t == "for_statement":
            var = n.child_by_field_name("variable")
            values = [c for c in n.children_by_field_name("value")]
            if var is not None:
                alts: list[str] = []
                for v in values:
                    alts += [self._tilde(a) for a in self.word(v)]
                self.vars[var.text.decode()] = tuple(alts[:_MAX_ALTS]) or (UNKNOWN,)
            body = n.child_by_field_name("body")
            if body is not None:
                self.walk(body)
            return []
        if t == "function_definition":
            body = n.child_by_field_name("body")
            if body is not None:
                self.walk(body)  # assume it is called: its effects are the script's
            return []
        if t == "ERROR" or n.is_missing:
            raise ShellParseError(f"cannot parse shell near {n.text.decode('utf-8', 'replace')[:40]!r}")
        if t in ("comment", ";", "&", "&&", "||", "\n", "(", ")", "{", "}", "!", "|", "|&"):
            return []
        out: list[Cmd] = []
        for c in n.children:
            if c.type == "command_substitution":
                self.word(c)
            elif c.type in ("word", "string", "concatenation", "simple_expansion", "expansion", "raw_string", "number"):
                continue
            else:
                out += self.statement(c)
        return out

    def assign(self, n: ts.Node) -> None:
        name = n.child_by_field_name("name")
        value = n.child_by_field_name("value")
        if name is None:
            return
        key = name.text.decode()
        if value is None:
            self.vars[key] = ("",)
        elif value.type == "array":
            alts: list[str] = []
            for c in value.children:
                if c.type not in ("(", ")"):
                    alts += [self._tilde(a) for a in self.word(c)]
            self.vars[key] = tuple(alts[:_MAX_ALTS]) or ("",)
            self.arrays[key] = alts[:_MAX_ALTS * 4]
        else:
            w = self.word(value)
            self.vars[key] = tuple(self._tilde(a) for a in w)

    def _array_words(self, n: ts.Node) -> list[Word]:
        """"${a[@]}", ${a[*]}: the words of an array set earlier in the text ([] when `n` is not one)."""
        if not self.arrays or n.type not in ("string", "expansion"):
            return []
        m = _ARRAY_ALL.fullmatch(n.text.decode("utf-8", "replace"))
        return [(x,) for x in self.arrays.get(m.group(1), [])] if m else []

    def _arg(self, n: ts.Node) -> Word:
        """An argument word: expanded, and `~` at its start resolved."""
        w = self.word(n)
        return tuple(self._tilde(a) for a in w) if any(a.startswith("~") for a in w) else w

    def _ifs(self) -> str:
        ifs = self.vars.get("IFS")
        return ifs[0] if ifs and ifs[0] and UNKNOWN not in ifs[0] else " \t\n"

    def _split(self, s: str) -> list[str]:
        return [x for x in re.split("[" + re.escape(self._ifs()) + "]+", s) if x]

    def _tilde(self, s: str) -> str:
        return resolve(s, self.where) if s.startswith("~") else s

    def pipeline(self, n: ts.Node, stdin: Cmd | None) -> list[Cmd]:
        members: list[Cmd] = []
        prev = stdin
        for c in n.children:
            if c.type in ("|", "|&"):
                continue
            got = self.statement(c, prev)
            if got:
                if prev is not None and got[0].stdin is None:
                    got[0].stdin = prev
                    prev.stdout = got[0]
                members += got
                prev = got[-1]
        for m in members:
            m.pipeline = members
        return members

    def redirected(self, n: ts.Node, stdin: Cmd | None) -> list[Cmd]:
        body = n.child_by_field_name("body")
        cmds = self.statement(body, stdin) if body is not None else []
        target = cmds[-1] if cmds else None
        more: list[Cmd] = []
        for r in n.children_by_field_name("redirect"):
            if r.type == "file_redirect":
                op = "".join(c.text.decode() for c in r.children if not c.is_named)  # >, >>, &>, <, >& ...
                dests = r.children_by_field_name("destination")
                fd = r.child_by_field_name("descriptor")
                if dests and target is not None:
                    target.redirects.append(Redirect(_OP_NOISE.sub("", op), self.word(dests[0]), fd.text.decode() if fd else ""))
                    # `find / -name k 2>/dev/null -exec cat {} +`: words after a redirect are still arguments
                    target.argv += [self._arg(x) for x in dests[1:]]
            elif r.type == "heredoc_redirect":
                bodies = [c for c in r.children if c.type == "heredoc_body"]
                text = bodies[0].text.decode("utf-8", "replace") if bodies else ""
                if target is not None:
                    target.heredoc = text
                for c in r.children:
                    if c.type in ("pipeline", "command", "list", "redirected_statement"):
                        got = self.statement(c, target)
                        if got and target is not None and got[0].stdin is None:
                            got[0].stdin = target
                            target.stdout = got[0]
                        more += got
            elif r.type == "herestring_redirect":
                vals = [c for c in r.children if c.type != "<<<"]
                if target is not None and vals:
                    target.heredoc = self.word(vals[0])[0]
        if more and target is not None:
            members = [*cmds, *more]
            for m in members:
                m.pipeline = members
        return cmds + more

    def command(self, n: ts.Node, stdin: Cmd | None) -> Cmd:
        env: dict[str, str] = {}
        argv: list[Word] = []
        redirects: list[Redirect] = []
        dynamic = False
        here: str | None = None
        ifs = self._ifs()
        for c in n.children:
            t = c.type
            if t == "word":  # the common case: a literal word (never split, `~` at its start resolved)
                s = c.text.decode("utf-8", "replace")
                if "\\" in s:
                    s = _BACKSLASH.sub(r"\1", s)
                argv.append((self._tilde(s),) if s.startswith("~") else (s,))
            elif t == "variable_assignment":
                name = c.child_by_field_name("name")
                value = c.child_by_field_name("value")
                if name is not None:
                    env[name.text.decode()] = self.word(value)[0] if value is not None else ""
            elif t == "command_name" and (spliced := self._array_words(c.children[0] if c.children else c)):
                argv += spliced  # "${cmd[@]}" as the command: its words are the argv
            elif t == "command_name":
                w = self.word(c.children[0]) if c.children else ("",)
                raw = c.text.decode("utf-8", "replace").strip("\"'${}")
                if (UNKNOWN in w[0] or SECRET in w[0]) and raw in TOOL_VARS:
                    w = (raw.lower(),)
                if UNKNOWN in w[0] or SECRET in w[0]:
                    dynamic = True
                if c.children and c.children[0].type in _UNQUOTED and any(ch in w[0] for ch in ifs):
                    argv += [(x,) for x in self._split(w[0])]  # rm${IFS}-rf${IFS}~ is three words
                    continue
                argv.append(w)
            elif t == "file_redirect":
                dests = c.children_by_field_name("destination")
                op = "".join(x.text.decode() for x in c.children if not x.is_named)
                if dests:
                    redirects.append(Redirect(_OP_NOISE.sub("", op), self.word(dests[0])))
                    argv += [self._arg(x) for x in dests[1:]]
            elif t == "herestring_redirect":
                vals = [x for x in c.children if x.type != "<<<"]
                if vals:
                    here = self.word(vals[0])[0]
            elif t in _ARG_NODES:
                spliced = self._array_words(c)
                if spliced:
                    argv += spliced
                    continue
                w = self.word(c)
                if t == "concatenation" and any(a.startswith("~") for a in w):
                    w = tuple(self._tilde(a) for a in w)
                if t == "concatenation" and len(w) > 1 and _BRACE_WORDS.fullmatch(c.text.decode("utf-8", "replace")):
                    argv += [(a,) for a in w]  # {rm,-rf,~} is three words
                elif t in _UNQUOTED and len(w) == 1 and any(ch in w[0] for ch in ifs) and not _quoted(c):
                    argv += [(x,) for x in self._split(w[0])]  # unquoted expansions are split on IFS
                else:
                    argv.append(w)
            elif t == "ERROR":
                raise ShellParseError(f"cannot parse shell near {c.text.decode('utf-8', 'replace')[:40]!r}")
        return self.emit(Cmd(argv, self.where, redirects, env, stdin, heredoc=here, dynamic_name=dynamic))

    def emit(self, cmd: Cmd) -> Cmd:
        """A simple command read: linked to the one piping into it, kept in order, and a `cd` followed."""
        if cmd.stdin is not None:
            cmd.stdin.stdout = cmd
        self.cmds.append(cmd)
        argv = cmd.argv
        if argv and argv[0][0] in ("cd", "pushd") and (len(argv) == 1 or argv[1][0] != "-"):
            self.where = self.where.at(resolve(argv[1][0], self.where) if len(argv) >= 2 else self.where.home)
            self.vars["PWD"] = (self.where.cwd,)
        return cmd


def _cmd_name(c: Cmd) -> str:
    return c.argv[0][0].rsplit("/", 1)[-1] if c.argv and c.argv[0] else ""


def static_decode(c: Cmd) -> str | None:
    """`echo TEXT | base64 -d` (or xxd -r -p, rev) with TEXT in the command: what it prints."""
    n = _cmd_name(c)
    src = c.stdin
    if src is None or _cmd_name(src) not in ("echo", "printf") or c.heredoc:
        return None
    words = [w[0] for w in src.argv[1:] if not re.fullmatch(r"-[neE]+", w[0])]
    text = "".join(words) if _cmd_name(src) == "echo" else printf_text(words)
    if UNKNOWN in text:
        return None
    flags = [w[0] for w in c.argv[1:]]
    try:
        if n in ("base64", "basenc") and any(f in ("-d", "--decode", "-D") for f in flags):
            return base64.b64decode(text.strip() + "=" * (-len(text.strip()) % 4)).decode("utf-8", "replace")
        if n == "base32" and any(f in ("-d", "--decode") for f in flags):
            return base64.b32decode(text.strip()).decode("utf-8", "replace")
        if n == "xxd" and "-r" in flags:
            return binascii.unhexlify(re.sub(r"\s", "", text)).decode("utf-8", "replace")
        if n == "rev":
            return text[::-1]
        if n == "openssl" and ("base64" in flags or "-base64" in flags or "-a" in flags) and "-d" in flags:
            b64 = re.sub(r"\s", "", text)
            return base64.b64decode(b64 + "=" * (-len(b64) % 4)).decode("utf-8", "replace")
    except (ValueError, binascii.Error):
        return None
    return None


def printf_text(words: list[str]) -> str:
    """What printf FORMAT ARGS... prints, for %s and %b (enough to see a command built by it)."""
    if not words:
        return ""
    fmt, rest = ansi_c(words[0]), list(words[1:])  # the format's escapes: \NNN octal, \xHH, \n
    out = re.sub(r"%[sbd]", lambda _m: rest.pop(0) if rest else "", fmt)
    return out + (" ".join(rest) if rest else "")


def _dq_unescape(s: str) -> str:
    """Inside double quotes a backslash escapes only $ ` " \\ and a newline (which it removes)."""
    return _DQ_ESC.sub(lambda m: "" if m.group(1) == "\n" else m.group(1), s) if "\\" in s else s


def _quoted(n: ts.Node) -> bool:
    """A word with a quoted part: its spaces are the quote's, not IFS's (--opt='a b' is one word)."""
    return any(c.type in ("string", "raw_string", "ansi_c_string", "translated_string") for c in n.children)


def _origin(inner: list[Cmd]) -> str:
    """What a command substitution's output is: a download (NET), decoded text (DECODED) or a local tool's (LOCAL)."""
    names = {(c.argv[0][0].rsplit("/", 1)[-1] if c.argv and c.argv[0] else "") for c in inner}
    if names & _NET_CMDS:
        return NET
    if names & _DECODE_CMDS or any(c.dynamic_name for c in inner) or not names:
        return DECODED
    return LOCAL


def parse(text: str, where: Where, vars: dict[str, Word] | None = None, depth: int = 0) -> Walker:
    """Parse and walk `text`; Walker.cmds are its simple commands in order. ShellParseError when it is not shell."""
    tree = _PARSER.parse(text.encode("utf-8", "surrogatepass"))
    root = tree.root_node
    w = Walker(where, vars, depth)
    if root.has_error:
        bad = _first_error(root)
        raise ShellParseError(f"cannot parse shell near {bad!r}")
    w.walk(root)
    return w


def _first_error(n: ts.Node) -> str:
    stack = [n]
    while stack:
        x = stack.pop()
        if x.type == "ERROR" or x.is_missing:
            return x.text.decode("utf-8", "replace")[:40] or x.type
        stack.extend(reversed(x.children))
    return n.text.decode("utf-8", "replace")[:40]


def literal(argv: list[str], where: Where) -> Walker:
    """An argv list (Codex's `shell` form): words are literal, never re-split or expanded."""
    w = Walker(where)
    w.cmds.append(Cmd([(a,) for a in argv], where))
    return w
