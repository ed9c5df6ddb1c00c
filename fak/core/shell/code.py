"""Interpreter one-liners (python -c, perl -e, ruby -e, node -e, php -r, awk programs, heredocs fed to an
interpreter): the same effects, found in the code.

Not an interpreter: the code is scanned for the common stdlib calls that delete, write, chmod, read,
connect or run a command, and each call's argument is resolved from string literals, home expressions
(`os.path.expanduser("~")`, `Path.home()`, `process.env.HOME`, `ENV["HOME"]`, ...) and simple assignments
in the same code. A shell string handed to `os.system`/`subprocess`/`execSync`/`system`/backticks is
parsed as shell, recursively. A destructive call whose target cannot be resolved is `opaque`, classed
by the most sensitive path the code mentions, so code that cannot be judged near a sensitive target
needs a witness instead of passing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fak.core.shell.effect import SENSITIVE, Effect
from fak.core.shell.parse import ShellParseError
from fak.core.shell.targets import CREDENTIAL_STORES, UNKNOWN, Where, classify, display, resolve

_HOME_EXPR = re.compile(
    r"os\.path\.expanduser\(\s*(['\"])~(?P<rest1>[^'\"]*)\1\s*\)|(?:pathlib\.)?Path\.home\(\)|Path\(\s*(['\"])~(?P<rest2>[^'\"]*)\3\s*\)\.expanduser\(\)"
    r"|os\.environ\[\s*['\"]HOME['\"]\s*\]|os\.environ\.get\(\s*['\"]HOME['\"][^)]*\)|os\.getenv\(\s*['\"]HOME['\"][^)]*\)"
    r"|process\.env\.HOME|process\.env\[\s*['\"]HOME['\"]\s*\]|\b\w+\.homedir\(\)|require\(\s*['\"]os['\"]\s*\)\.homedir\(\)"
    r"|ENV\[\s*['\"]HOME['\"]\s*\]|ENV\.fetch\(\s*['\"]HOME['\"]\s*\)|\$ENV\{\s*['\"]?HOME['\"]?\s*\}|Dir\.home|File\.expand_path\(\s*(['\"])~(?P<rest3>[^'\"]*)\5\s*\)"
    r"|getenv\(\s*['\"]HOME['\"]\s*\)|Deno\.env\.get\(\s*['\"]HOME['\"]\s*\)|os\.getenv\(\s*['\"]HOME['\"]\s*\)|\$_SERVER\[\s*['\"]HOME['\"]\s*\]|ENVIRON\[\s*\"HOME\"\s*\]"
)
_STR = re.compile(r"[rbfu]{0,2}(\"\"\"|'''|\"|'|`)((?:\\.|(?!\1).)*)\1", re.S)
_LITERAL_LOOP = re.compile(r"\bfor\s+(\w+)\s+in\s+([\[(]\s*(?:[rbu]?(['\"])[^'\"\n]*\3\s*,?\s*)+[\])]|%w[\[(][^\])]*[\])])")
_ASSIGN = re.compile(r"(?:^|[;\n{(]|\b(?:my|let|const|var|local)\s)\s*\$?([A-Za-z_]\w*)\s*=\s*([^;\n]+)")

# (regex over code, effect kind, how); the call's first argument is the target
_CALLS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"\b(?:shutil\.)?rmtree\s*\(|\bremove_tree\s*\(|\bFileUtils\.(?:rm_rf|rm_r|rm|remove_dir|remove_entry(?:_secure)?|rmtree|remove|rm_f)\s*\(?"
                r"|(?:\bfs|\brequire\(\s*['\"](?:node:)?fs['\"]\s*\))(?:\.promises)?\.(?:rmSync|rmdirSync|unlinkSync|rm|rmdir|unlink)\s*\(|\brimraf(?:\.sync)?\s*\(|\bfse?\.(?:removeSync|remove|emptyDirSync|emptyDir)\s*\("
                r"|\bos\.(?:remove|unlink|rmdir|removedirs)\s*\(|\bsend2trash\s*\(|\bFile\.(?:delete|unlink)\s*\(|\bDir\.(?:rmdir|delete|unlink)\s*\("
                r"|(?<![\w.])unlink\s*\(?|(?<![\w.])rmdir\s*\(|\bDeno\.remove(?:Sync)?\s*\(|\bos\.execute\s*\(|\bBun\.file\([^)]*\)\.delete\s*\("), "delete", "delete call"),
    (re.compile(r"\.(?:unlink|rmdir|rmtree)\s*\("), "delete", "path method"),
    (re.compile(r"\bopen\s*\((?=(?:[^()]|\([^()]*\))*,\s*['\"][wax+]|[^)]*['\"]\s*(?:>|>>|\+>|\+<)|\s*(?:\w+\s*,\s*)?['\"](?:>|>>|\+>|\+<))|(?:\bfs|\brequire\(\s*['\"](?:node:)?fs['\"]\s*\))\.(?:writeFileSync|appendFileSync|writeFile|appendFile|createWriteStream|copyFileSync|cpSync|renameSync|symlinkSync|linkSync)\s*\("
                r"|\bFile\.(?:write|open(?=[^)]*['\"][wa])|symlink|rename|binwrite)\s*\(|\bfile_put_contents\s*\(|\bshutil\.(?:copy\w*|move|copytree)\s*\([^,]*,|\bos\.(?:rename|replace|symlink|link)\s*\([^,]*,"
                r"|\bIO\.write\s*\(|\bFileUtils\.(?:cp\w*|mv|touch|ln\w*|install)\s*\(?[^,]*,|\bDeno\.writeTextFile(?:Sync)?\s*\(|\bBun\.write\s*\("), "write", "write call"),
    (re.compile(r"\.(?:write_text|write_bytes|touch|symlink_to|rename|replace|hardlink_to)\s*\("), "write", "path method"),
    (re.compile(r"\bos\.(?:chmod|chown|lchown|lchmod)\s*\(|\bfs\.(?:chmodSync|chownSync|chmod|chown)\s*\(|\bFile\.(?:chmod|chown)\s*\(|\bFileUtils\.(?:chmod|chown)\w*\s*\(?"
                r"|(?<![\w.])chmod\s*\(?|(?<![\w.])chown\s*\(?|\.chmod\s*\("), "chmod", "chmod call"),
    (re.compile(r"\bopen\s*\(|(?:\bfs|\brequire\(\s*['\"](?:node:)?fs['\"]\s*\))\.(?:readFileSync|readFile|createReadStream|readdirSync)\s*\(|\bFile\.(?:read|readlines|open|binread)\s*\(|\bIO\.read\s*\("
                r"|\bfile_get_contents\s*\(|\.read_text\s*\(|\.read_bytes\s*\(|\bglob\.glob\s*\(|\bos\.listdir\s*\(|\bos\.walk\s*\(|\bDeno\.readTextFile\s*\("), "read", "read call"),
]
_SHELL_CALL = re.compile(
    r"\bos\.(?:system|popen|exec\w*|spawn\w*)\s*\(|\bsubprocess\.(?:run|call|check_call|check_output|Popen|getoutput|getstatusoutput)\s*\("
    r"|\b(?:child_process|cp|require\(\s*['\"]child_process['\"]\s*\))\.(?:exec|execSync|spawn|spawnSync|execFile|execFileSync)\s*\("
    r"|\bos\.execute\s*\(|(?<![\w.])(?:execSync|spawnSync|execFileSync|system|exec|spawn|popen|shell_exec|passthru|proc_open|qx|Open3\.\w+|IO\.popen|Kernel\.system|Deno\.run|Bun\.spawn(?:Sync)?)\s*\(?"
    r"|\bnew\s+ProcessBuilder\s*\(|\bRuntime\.getRuntime\(\)\.exec\s*\(|\bProcessBuilder\s*\("
    r"|%x\{|`")
# Code that opens a raw socket (a reverse shell needs one), and code that reaches the network at all
_RAW_SOCKET = re.compile(r"\bsocket\.(?:socket|create_connection)\b|\bsocket\s*\(\s*\w+\s*,\s*(?:PF|AF)_INET"
                         r"|require\(\s*['\"](?:node:)?(?:net|dgram|tls)['\"]\s*\)|\bnet\.(?:connect|createConnection|Socket)\b"
                         r"|\bIO::Socket\b|\bTCPSocket\b|\bfsockopen\b|\bwebsocket")
_NET = re.compile(_RAW_SOCKET.pattern + r"|require\(\s*['\"](?:node:)?https?['\"]\s*\)|\burllib\b|\brequests\.\w+\s*\(|\bhttp\.client\b"
                  r"|\bhttpx\b|\bfetch\s*\(|\bhttps?\.(?:request|get)\s*\(|\bNet::HTTP\b|\bLWP::|\bcurl_exec\b|\bsmtplib\b"
                  r"|\bftplib\b|\baiohttp\b", re.S)
_SPAWN_SHELL = re.compile(r"['\"](?:/bin/)?(?:ba|z|da)?sh(?:\s+-i)?['\"\s]|/bin/(?:ba|z|da)?sh\b|\bpty\.spawn\b|\bos\.dup2\b|\bsubprocess\.\w+\([^)]*(?:/bin/(?:ba)?sh|['\"](?:ba)?sh['\"])|\bspawn\(\s*['\"](?:/bin/)?(?:ba)?sh['\"]"
                          r"|\bexec\s*\(\s*['\"]/bin/(?:ba)?sh|\bSTDIN\.reopen|\bIO\.popen\(\s*['\"](?:/bin/)?sh|\bproc_open\(\s*['\"](?:/bin/)?sh|-i['\"]\s*[\],)]")
_DECODE_EXEC = re.compile(r"\b(?:exec|eval|compile|system|Function)\s*\([^\n]*(?:b64decode|b32decode|a85decode|fromhex|unhexlify|decodebytes|codecs\.decode|"
                          r"Buffer\.from\([^)]*base64|atob\(|decode_base64|unpack\(\s*['\"]m|base64_decode|zlib\.decompress|marshal\.loads|rot13)"
                          r"|\b(?:exec|eval)\s*\(\s*(?:urllib|requests|urlopen|fetch|http)", re.S)
_CHAR_CODES = re.compile(r"""(?:''|"")\.join\(\s*(?:map\(\s*chr\s*,\s*|\(?\s*chr\(\w+\)\s+for\s+\w+\s+in\s+)[\[(]([\dx,\s]+)[\])]\s*\)?\s*\)"""
                         r"|\bbytes\(\s*\[([\dx,\s]+)\]\s*\)\.decode\(\s*\)|\bString\.fromCharCode\(\s*([\dx,\s]+)\)"
                         r"|\[([\d,\s]+)\]\.pack\(\s*['\"][cCU]\*['\"]\s*\)")
# kill(-1, ...) / kill 9, -1: a signal to every process the user may signal
_KILL_ALL = re.compile(r"(?<![\w.])(?:os\.kill|process\.kill|Process\.kill|posix\.kill|kill)\s*\(?\s*"
                       r"(?:-1\s*[,)]|['\"]?(?:SIG)?(?:KILL|TERM|HUP|INT)['\"]?\s*,\s*-1\b|(?:9|15|signal\.SIG\w+)\s*,\s*-1\b)")
_KILL_CALL = re.compile(r"(?<![\w.])(?:os\.kill|process\.kill|Process\.kill|kill)\s*\(")
_EVERY_PID = re.compile(r"listdir\(\s*['\"]/proc['\"]|readdirSync\(\s*['\"]/proc['\"]|Dir\.(?:entries|children|glob)\(\s*['\"]/proc"
                        r"|psutil\.(?:process_iter|pids)\(|glob\(\s*['\"]/proc/")
# exec/eval of something that is not a string literal: in code that also reaches the network, downloaded code
_EXEC_CALL = re.compile(r"(?<![\w.])(?:exec|eval|compile|Function|instance_eval|class_eval|vm\.runInThisContext)\s*\(|(?<![\w.$])eval\s+(?=[$\w])")
_ENV_ALL = re.compile(r"\bos\.environ\b(?!\s*[\[.]\s*(?:get\s*\(\s*)?['\"](?!.*(?:KEY|TOKEN|SECRET|PASS)))|\bprocess\.env\b(?!\.\w)|\bENV\.to_h\b|%ENV\b|\bgetenv\(\s*\)|\$_ENV\b|\bdict\(os\.environ\)")
_SECRET_ENV = re.compile(r"(?:environ|env|ENV|getenv)[\[\.(\{]\s*['\"]?([A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)[A-Z0-9_]*)")


def _balanced(code: str, start: int) -> str:
    """The text from `start` to the parenthesis closing the one just before it (or the line's end)."""
    depth = 1
    i = start
    while i < len(code) and depth:
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "\n" and depth == 1 and not code[start:i].strip().endswith(","):
            break
        i += 1
    return code[start:i - 1 if depth == 0 else i]


def _literals(text: str, names: dict[str, str]) -> list[str]:
    """Paths an expression names: its string literals (home expressions as ~), joined as the code joins them
    (`'~' + '/.ssh'`, `Path.home() / '.ssh'`, `os.path.join(HOME, '.ssh')`)."""
    t = _HOME_EXPR.sub(lambda m: "'~" + (m.group("rest1") or m.group("rest2") or m.group("rest3") or "") + "'", text)
    for name, val in names.items():
        pat = rf"(?<![\w.$'\"]){re.escape(name)}(?![\w'\"(])"
        if re.search(pat, t):
            t = re.sub(pat, lambda _m, v=val: v, t)
    spans = list(_STR.finditer(t))
    if not spans:
        return []
    joins = bool(re.search(r"\bjoin\s*\(|\bPath\s*\(|\bresolve\s*\(|\bFile\.join\b|\bcatfile\b", t[:spans[0].start()]))
    out: list[str] = []
    cur = spans[0].group(2)
    for prev, nxt in zip(spans, spans[1:], strict=False):
        gap = t[prev.end():nxt.start()]
        if re.fullmatch(r"\s*(?:[+/.]|\.\.)\s*", gap) or (joins and re.fullmatch(r"\s*,\s*", gap)):
            piece = nxt.group(2)
            cur = cur + piece if (cur.endswith("/") or piece.startswith("/") or "+" in gap or gap.strip() in (".", "..")) \
                else cur + "/" + piece
        else:
            out.append(cur)
            cur = nxt.group(2)
            joins = False
    out.append(cur)
    return out[:1] + [x for x in out[1:] if x.startswith(("/", "~"))]


# Judges shell text (str) or an argv (list) found in code; supplied by the shell model (commands.Judge),
# so this module does not import it back.
ShellJudge = Callable[[str | list[str], Where, int], list[Effect]]


_IN_STRING_HOME = re.compile(r"\$ENV\{['\"]?HOME['\"]?\}|\$\{HOME\}|\$HOME\b|#\{ENV\[['\"]HOME['\"]\]\}|#\{Dir\.home\}")


def scan(lang: str, code: str, where: Where, depth: int, shell: ShellJudge) -> list[Effect]:
    out: list[Effect] = []
    code = _CHAR_CODES.sub(_from_codes, code)  # ''.join(map(chr, [114, 109])), String.fromCharCode(...): 'rm' 
    # "$ENV{HOME}/.ssh", "#{Dir.home}/x" inside a string are home, as ~ is
    code = _STR.sub(lambda m: _IN_STRING_HOME.sub("~", m.group(0)) if "HOME" in m.group(0) or "home" in m.group(0) else m.group(0), code)
    if lang.startswith("awk") and "/inet/" in code:
        out.append(Effect("run-remote", "network", "network", "awk /inet/tcp (a shell on a socket)"))
    names: dict[str, str] = {}
    loops = {m.group(1): m.group(2) for m in _LITERAL_LOOP.finditer(code)}  # for d in ('build', 'dist'): each one
    for m in _ASSIGN.finditer(code):
        rhs = m.group(2).strip()
        if _STR.search(rhs) or _HOME_EXPR.search(rhs):
            names[m.group(1)] = rhs.rstrip(",")
    lang_name = re.sub(r"\d.*$", "", lang)

    def target_effects(kind: str, args: str, how: str) -> bool:
        got = False
        first = args.split(",")[0].strip()
        lits = [x.group(2) for x in _STR.finditer(loops[first])] if first in loops else _literals(args, names)
        for lit in lits:
            if not lit or "\n" in lit or len(lit) > 300:
                continue
            if kind == "read" and not (lit.startswith(("/", "~", ".")) or "/" in lit):
                continue
            p = resolve(lit.replace("${HOME}", "~").replace("$HOME", "~"), where)
            cls = classify(p, where)
            if kind == "read":
                if cls == "credential":
                    out.append(Effect("read-secret", display(p, where), cls, f"{lang_name} {how}"))
                got = True
                continue
            from fak.core.shell.targets import is_persist

            k = "persist" if kind == "write" and is_persist(p, where) else kind
            out.append(Effect(k, display(p, where), cls, f"{lang_name} {how}"))
            got = True
        return got

    for rx, kind, how in _CALLS:
        for m in rx.finditer(code):
            call = m.group(0)
            start = m.end()
            if how == "path method":  # Path("x").unlink(): the receiver is the target
                recv = code[max(0, m.start() - 200):m.start()]
                pm = re.search(r"(?:Path|PurePath|pathlib\.Path)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*(?:/\s*[^.]+)?$", recv)
                vm = re.search(r"([A-Za-z_]\w*)\s*$", recv)
                if pm:
                    args = re.sub(r"\)\s*/\s*", ", ", pm.group(0)[pm.group(0).index("(") + 1:])
                elif vm and vm.group(1) in names:
                    args = names[vm.group(1)]
                elif re.search(r"Path\.home\(\)\s*(?:/[^.]*)?$", recv):
                    args = "'~'" + "".join(", " + x for x in re.findall(r"/\s*(['\"][^'\"]*['\"])", recv[recv.rfind("Path.home()"):]))
                else:  # a receiver computed in the code (a loop variable): judged by what the code names
                    worst = _worst_path(code, names, where)
                    if worst and kind != "read":
                        out.append(Effect("opaque", f"{lang_name} .{call.strip('.( ')}() of a computed path", worst,
                                          f"{lang_name} {call.strip('.( ')} of a computed path"))
                    continue
            else:
                args = _balanced(code, start) if call.rstrip().endswith("(") else code[start:start + 200].split(";")[0].split("\n")[0]
            if kind == "read" and call.startswith("open") and re.search(r",\s*['\"][wax+]", args):
                continue
            if not target_effects(kind, args, how) and kind != "read":
                worst = _worst_path(code, names, where)
                out.append(Effect("opaque", f"{lang_name} {call.strip('( ')}(...)", worst or "unknown",
                                  f"{lang_name} {call.strip('( ')} of a computed path"))
    computed: str | None = None
    for m in _SHELL_CALL.finditer(code):
        tok = m.group(0)
        if tok == "`" and lang_name not in ("perl", "ruby", "php"):
            continue
        if tok == "%x{":
            body = _balanced(code, m.end())
        elif tok == "`":
            end = code.find("`", m.end())
            body = code[m.end():end] if end > 0 else ""
            if body:
                _shell(body, where, depth, out, lang_name, shell)
            continue
        else:
            body = _balanced(code, m.end()) if tok.rstrip().endswith("(") else code[m.end():m.end() + 300].split(";")[0]
        lits = [x.group(2) for x in _STR.finditer(body)]
        head = body.lstrip()
        runs_code = tok.startswith(("exec", "eval")) and lang_name in ("python", "node", "deno", "bun")  # code, not a command
        if computed is None and head and not head.startswith("[") and not runs_code and _computed_first(head) and _NET.search(code):
            computed = tok.strip("( ")  # a command from a variable, in code that talks to the network
        java_argv = "ProcessBuilder" in tok and len(lits) > 1  # new ProcessBuilder("sh", "-c", "...")
        if head.startswith("[") or java_argv or (lits and "shell=True" not in body and lang_name == "python" and len(lits) > 1
                                                 and not tok.startswith("os.system")):
            argv = [x.encode().decode("unicode_escape") if "\\" in x else x for x in lits]
            if argv:
                out += shell(argv, where, depth + 1)
            continue
        if lits:
            joined = _literals(body, names)
            text = joined[0] if joined else lits[0]
            if "pack(" in body:  # perl pack("H*", "726d..."): the hex literal is the command
                hexes = [x for x in lits if re.fullmatch(r"(?:[0-9a-fA-F]{2})+", x)]
                if hexes:
                    text = bytes.fromhex(hexes[0]).decode("utf-8", "replace")
            _shell(text, where, depth, out, lang_name, shell)
        elif body.strip():
            worst = _worst_path(code, names, where)
            if worst:
                out.append(Effect("opaque", f"{lang_name} {tok.strip('( ')}(...)", worst, f"{lang_name} runs a computed command"))
    net = _NET.search(code)
    if net and _HOME_EXPR.search(code) and not any(e.kind == "read-secret" for e in out):
        # ['.npmrc', '.git-credentials'].map(n => read(homedir() + '/' + n)): stores named apart from the home
        store = next((lit for lit in (m.group(2).strip("/") for m in _STR.finditer(code)) if _is_store(lit)), None)
        if store is not None:
            out.append(Effect("read-secret", "~/" + store, "credential", f"{lang_name} reads ~/{store}"))
    if _KILL_ALL.search(code):
        out.append(Effect("kill", "every process", "process", f"{lang_name} kill(-1)"))
    elif _KILL_CALL.search(code) and _EVERY_PID.search(code):
        out.append(Effect("kill", "every process", "process", f"{lang_name} kill of every pid it lists"))
    if net and computed is not None and not _SPAWN_SHELL.search(code):
        # commands read from a raw socket are a reverse shell; from an HTTP reply, remote code all the same
        what = "a command read from a socket (reverse shell)" if _RAW_SOCKET.search(code) else "a command read from the network"
        out.append(Effect("run-remote", _host_in(code), "network", f"{lang_name} {computed} of {what}"))
    if net and not _DECODE_EXEC.search(code):
        for m in _EXEC_CALL.finditer(code):
            arg = _balanced(code, m.end()) if m.group(0).rstrip().endswith("(") else code[m.end():m.end() + 200].split(";")[0]
            if arg.strip() and _computed_first(arg.strip()):
                out.append(Effect("run-remote", _host_in(code), "network", f"{lang_name} {m.group(0).strip('( ')} "
                                  "of code it fetched"))
                break
    if net and _SPAWN_SHELL.search(code):
        host = _host_in(code)
        out.append(Effect("run-remote", host, "network", f"{lang_name} socket wired to a shell (reverse shell)"))
    if _DECODE_EXEC.search(code):
        out.append(Effect("run-remote", "decoded code", "unknown", f"{lang_name} runs decoded or downloaded code"))
    if net:
        sec = _SECRET_ENV.search(code)
        if sec:
            out.append(Effect("send", "network", "credential", f"{lang_name} sends ${sec.group(1)}"))
        elif _ENV_ALL.search(code):
            out.append(Effect("send", "network", "credential", f"{lang_name} sends the environment"))
        for e in list(out):
            if e.kind == "read-secret":
                out.append(Effect("send", "network", "credential", f"{lang_name} sends {e.target}"))
                break
        for h in re.findall(r"['\"](?:https?://)?(169\.254\.169\.254|metadata\.google\.internal)", code):
            out.append(Effect("read-secret", h, "metadata", f"{lang_name} reads the cloud metadata endpoint"))
    if lang_name in ("python",) and re.search(r"\b(?:exec|eval)\s*\(\s*(?:input|sys\.stdin|open)\b", code):
        out.append(Effect("opaque", "python exec", _worst_path(code, names, where) or "unknown", "python exec of read code"))
    return out


def _from_codes(m: re.Match[str]) -> str:
    nums = next(g for g in m.groups() if g is not None)
    try:
        text = "".join(chr(int(x, 0)) for x in re.findall(r"0x[0-9a-fA-F]+|\d+", nums))
    except (ValueError, OverflowError):
        return m.group(0)
    return repr(text) if "'" not in text else '"' + text.replace('"', '\\"') + '"'


def _is_store(name: str) -> bool:
    """A credential store's name relative to home (.npmrc, .aws/credentials, .ssh/id_rsa)."""
    return bool(name) and any(name == s or name.startswith(s + "/") for s in CREDENTIAL_STORES if "*" not in s)


def _host_in(code: str) -> str:
    """The first host or address a string literal in the code names ('network' when none does)."""
    m = re.search(r"['\"](?:\w+://)?(\d+\.\d+\.\d+\.\d+|[\w-]+(?:\.[\w-]+)+)", code)
    return m.group(1) if m else "network"


def _computed_first(args: str) -> bool:
    """Whether a call's first argument is computed (a name, a call, $_), not a string literal or a list of them."""
    depth, i = 0, 0
    while i < len(args):
        ch = args[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            break
        i += 1
    first = args[:i].strip()
    return bool(first) and not _STR.fullmatch(first) and not first.startswith(("[", "%w", "qw"))


def _shell(text: str, where: Where, depth: int, out: list[Effect], lang: str, shell: ShellJudge) -> None:
    try:
        out += shell(text.encode().decode("unicode_escape") if "\\" in text else text, where, depth + 1)
    except ShellParseError:
        out.append(Effect("opaque", text[:40], "unknown", f"{lang} runs unparseable shell"))


def _worst_path(code: str, names: dict[str, str], where: Where) -> str:
    """The most sensitive class among the paths the code mentions ('' when none is sensitive)."""
    t = _HOME_EXPR.sub("'~'", code)
    worst = ""
    order = ("root", "device", "system", "credential", "agent-state", "home", "project-root", "project-git")
    for m in _STR.finditer(t):
        lit = m.group(2)
        if not lit.startswith(("/", "~", "..")) or "\n" in lit or len(lit) > 200:
            continue
        cls = classify(resolve(lit.replace(UNKNOWN, ""), where), where)
        if cls in SENSITIVE and (not worst or order.index(cls) < order.index(worst)):
            worst = cls
    return worst
