"""Policy: a JSON file `{"version": "fak-policy/v1", ...}` compiled into an adjudicator (`policy(call)`)
and a result admitter (`policy.admit_result(call, result)`).

Fields (all optional except version):
  name                 label used as the verdict's `by` ("policy:<name>")
  default              "deny" (UNKNOWN_TOOL for a tool not allowed; the default) | "allow" | "defer"
  max_arg_bytes        arguments larger than this -> DENY OVERSIZE
  allow                tool names that may run
  allow_prefix         tool-name prefixes that may run (e.g. "mcp__fs__")
  deny                 tool names that never run -> DENY POLICY_BLOCK
  arg_rules            [{id?, tools?, field?, pattern, reason?, detail?, normalize?}] regex over an
                       argument (dotted field; a list is joined by spaces) or, without field, over
                       every string leaf -> DENY with reason (default POLICY_BLOCK).
                       "normalize": "shell" matches the raw text and also its shell normal form
                       (fak.core.shellnorm: quotes and backslash escapes removed, ${IFS} as a space,
                       $(echo x) / $(which x) as x, literal variables substituted, /usr/bin/rm as
                       rm, ...): a match on either denies. Also allowed on require_witness rules.
  self_modify          path globs (fnmatch: * crosses "/"; ~ expanded) -> DENY SELF_MODIFY when a
                       write tool targets them
  write_tools          {tool: [field | "@patch" | "@redirect"]}: where a tool's write targets are.
                       "@patch" reads apply_patch headers, "@redirect" shell `>`, `>>`, `tee` targets
  rate_limits          [{id?, tools?, per_minute, burst?}] a token bucket per rule -> DENY RATE_LIMITED
                       (disposition WAIT) when empty; only calls that passed the deny checks spend
  require_witness      [{id?, tools?, field?, pattern?, detail?}] -> REQUIRE_WITNESS
  transforms           [{id?, tools?, redact?: [field], field?, pattern?, replace?}] -> TRANSFORM
  quarantine_patterns  regexes over a result's text -> QUARANTINE (PROMPT_INJECTION)
  result_deny          [{pattern, reason?, detail?}] over a result's text -> DENY (default SECRET_EXFIL)

fak-policy/v2 adds the effect model (fak.core.shell, fak.core.toolmodel): every shell command is parsed and
judged by what it would do to which target, not by how it is spelled.
  effects              {"shell"|"read"|"write"|"search"|"patch"|"fetch": {tool: dotted field}}: where each
                       tool's command, path or URL is (default: Claude Code's, Codex's, aider-style tools)
  effect_rules         [{id, effect: [kind], target?: [class], verdict: deny|witness|allow, reason?, tools?,
                       detail?}]: a call whose effects match a rule gets its verdict; an "allow" rule exempts
                       the effects it matches from the rules after it; the most restrictive verdict wins.
                       Kinds and classes: fak.core.shell.effect.KINDS / CLASSES.
  unparseable          "deny" (default) | "witness": a shell command the parser cannot read
A refusal names the effect, its target and the rule: `delete ~ (home) by floor.delete-home [rm -r]`.

Order inside one call: OVERSIZE, deny list, unknown tool, arg_rules, self_modify, effect_rules, rate_limits,
require_witness, transforms, ALLOW. Paths are normalized lexically (no symlink resolution: no filesystem access on
the decision path) against `call.meta["cwd"]`, else the process cwd. A tool listed under
`tools` of a rule is "*"-able: omit `tools` (or use "*") for every tool.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fak.core.abi import RANK, Reason, Result, ToolCall, Verdict, VerdictKind
from fak.core.jsonfile import read_json
from fak.core.needles import combine, minimal, needles
from fak.core.ratelimit import RateLimit
from fak.core.shell.effect import CLASSES, KINDS
from fak.core.shellnorm import shell_normalize
from fak.core.toolmodel import DEFAULT as DEFAULT_MODEL
from fak.core.toolmodel import ShellParseError, ToolModel
from fak.errors import FakError

VERSION = "fak-policy/v1"
VERSION_2 = "fak-policy/v2"
_KNOWN_FIELDS = {
    "version", "name", "description", "default", "max_arg_bytes", "allow", "allow_prefix", "deny",
    "arg_rules", "self_modify", "write_tools", "rate_limits", "require_witness", "transforms", "quarantine_patterns",
    "result_deny",
}
_V2_FIELDS = {"effects", "effect_rules", "unparseable"}
# Which effect a refusal names when several are refused alike: the specific harm before its means
_NAMES_FIRST = {k: i for i, k in enumerate(reversed((
    "send", "run-remote", "delete", "write", "chmod", "persist", "tamper", "kill", "teardown", "history", "publish",
    "read-secret", "escalate", "opaque")))}
_EFFECT_VERDICTS = {"deny": VerdictKind.DENY, "witness": VerdictKind.REQUIRE_WITNESS, "allow": VerdictKind.ALLOW}
_PATCH_HDR = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$", re.M)
_REDIRECT = re.compile(r"(?:&>>?|\d?>>?\|?)\s*(?!&)([\"']?)([^\s;&|<>\"'()]+)\1|\btee\s+(?:-\w+\s+)*([^\s;&|<>()]+)")
_PLAN_CACHE_MAX = 4096
_HOME_VAR = re.compile(r"^\$(?:HOME\b|\{HOME\})")


@dataclass(slots=True)
class ArgRule:
    id: str
    tools: frozenset[str] | None  # None = every tool
    field: tuple[str, ...] | None  # None = all string leaves
    regex: re.Pattern[str] | None
    reason: Reason = Reason.POLICY_BLOCK
    detail: str = ""
    redact: tuple[tuple[str, ...], ...] = ()  # transforms only
    replace: str = "[REDACTED]"  # transforms only
    verdict: Verdict | None = None  # the prebuilt DENY of an arg rule (set by Policy)
    normalize: bool = False  # also match the shell normal form of the text (fak.core.shellnorm)
    needles: tuple[str, ...] | None = None  # witness rules: literals every match contains (set by Policy)


@dataclass(slots=True)
class EffectRule:
    id: str
    kinds: frozenset[str]
    classes: frozenset[str] | None  # None = any target
    verdict: VerdictKind
    reason: Reason
    tools: frozenset[str] | None = None
    detail: str = ""

    def matches(self, kind: str, cls: str, tool: str) -> bool:
        return kind in self.kinds and (self.classes is None or cls in self.classes) and (
            self.tools is None or tool in self.tools)


@dataclass(slots=True)
class _Check:
    """The arg rules of one tool that read the same field. A rule's regex runs only if one of its
    needles (literals every match contains) is in the text it is matched against, or if it has none
    (`always`). A normalizing rule is matched against the raw text and its shell normal form, so its
    needles are looked up in both (`norm_needles`: the normal form only)."""

    field: tuple[str, ...] | None
    rules: list[ArgRule]
    needles: list[tuple[str, int]]  # (needle, index into rules), looked up in the raw text
    always: list[int]
    norm_needles: list[tuple[str, int]]  # the normalizing rules' needles, looked up in the normal form
    normalizes: bool = False  # some rule here matches the normal form too


@dataclass(slots=True)
class _Plan:
    known: bool
    denied: bool
    checks: list[_Check]
    write_fields: list[str]
    limits: list[RateLimit]
    witness: list[ArgRule]
    transforms: list[ArgRule]


def _field_value(obj: Any, path: tuple[str, ...]) -> str | None:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
        if obj is None:
            return None
    if isinstance(obj, str):
        return obj
    if isinstance(obj, list):
        return " ".join(str(x) for x in obj)
    return json.dumps(obj, ensure_ascii=False)


def _applies(rule: ArgRule, tool: str) -> bool:
    return rule.tools is None or tool in rule.tools


def _matches(rule: ArgRule, call: ToolCall) -> bool:
    if rule.regex is None:
        return True
    text = call.args_text if rule.field is None else _field_value(call.args_obj, rule.field)
    if text is None:
        return False
    texts = (text,)
    if rule.normalize:
        norm = shell_normalize(text)
        texts = (text,) if norm == text else (text, norm)
    ns = rule.needles
    return any((ns is None or any(n in t for n in ns)) and rule.regex.search(t) is not None for t in texts)


@dataclass
class Policy:
    name: str
    source: str
    default: str = "deny"
    max_arg_bytes: int = 1 << 20
    allow: frozenset[str] = frozenset()
    allow_prefix: tuple[str, ...] = ()
    deny: frozenset[str] = frozenset()
    arg_rules: list[ArgRule] = field(default_factory=list)
    self_modify: re.Pattern[str] | None = None
    self_modify_globs: tuple[str, ...] = ()
    write_tools: dict[str, list[str]] = field(default_factory=dict)
    rate_limits: list[RateLimit] = field(default_factory=list)
    require_witness: list[ArgRule] = field(default_factory=list)
    transforms: list[ArgRule] = field(default_factory=list)
    quarantine: re.Pattern[str] | None = None
    result_deny: list[ArgRule] = field(default_factory=list)
    model: ToolModel | None = None  # v2: where each tool's effects come from
    effect_rules: list[EffectRule] = field(default_factory=list)
    unparseable: VerdictKind = VerdictKind.DENY
    version: str = VERSION
    _plans: dict[str, _Plan] = field(default_factory=dict, repr=False)
    _rule_of: dict[tuple[str, str, str], EffectRule | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.by = f"policy:{self.name}"
        # Most paths are cleared without the globs: a glob that starts with a literal can only match a
        # path with that prefix (one str.startswith); the others by literals every match contains.
        self._sm_prefixes: tuple[str, ...] = ()
        self._sm_trigger: re.Pattern[str] | None = None
        self._sm_any = False  # some glob has neither: always run the globs
        if self.self_modify is not None:
            floating = []
            for g in self.self_modify_globs:
                g = os.path.expanduser(g)
                lit = re.split(r"[*?\[]", g, maxsplit=1)[0]
                if lit:
                    self._sm_prefixes += (lit,)
                else:
                    floating.append(g)
            ns = needles("|".join(fnmatch.translate(g) for g in floating)) if floating else None
            if (floating and ns is None) or not self.self_modify_globs:  # (a Policy built without its globs)
                self._sm_any = True
            elif ns:
                self._sm_trigger = re.compile("|".join(map(re.escape, minimal(ns))))
        for r in self.require_witness:
            ns = needles(r.regex.pattern) if r.regex is not None else None
            r.needles = tuple(minimal(ns)) if ns else None
        for r in self.arg_rules:  # verdicts are immutable values: build each rule's DENY once
            r.verdict = Verdict.deny(r.reason, self.by, r.detail or f"arg rule {r.id}")
        self._allow_v = Verdict.allow(self.by)
        self._defer_v = Verdict(VerdictKind.DEFER, Reason.NONE, self.by)

    # -- adjudicator -------------------------------------------------------------------------
    def _plan(self, tool: str) -> _Plan:
        known = tool in self.allow or tool.startswith(self.allow_prefix) if self.allow_prefix else tool in self.allow
        by_field: dict[tuple[str, ...] | None, list[ArgRule]] = {}
        for r in self.arg_rules:
            if _applies(r, tool):
                by_field.setdefault(r.field, []).append(r)
        checks: list[_Check] = []
        for f, rs in by_field.items():
            pairs: list[tuple[str, int]] = []
            norm_pairs: list[tuple[str, int]] = []
            always: list[int] = []
            for i, r in enumerate(rs):
                ns = needles(r.regex.pattern) if r.regex is not None else None
                if ns is None:
                    always.append(i)
                else:
                    pairs += [(n, i) for n in minimal(ns)]
                    if r.normalize:
                        norm_pairs += [(n, i) for n in minimal(ns)]
            checks.append(_Check(f, rs, pairs, always, norm_pairs, any(r.normalize for r in rs)))
        plan = _Plan(
            known=known or self.default == "allow",
            denied=tool in self.deny,
            checks=checks,
            write_fields=self.write_tools.get(tool, []) if self.self_modify is not None else [],
            limits=[r for r in self.rate_limits if r.tools is None or tool in r.tools],
            witness=[r for r in self.require_witness if _applies(r, tool)],
            transforms=[r for r in self.transforms if _applies(r, tool)],
        )
        if len(self._plans) >= _PLAN_CACHE_MAX:
            self._plans.clear()
        self._plans[tool] = plan
        return plan

    def __call__(self, call: ToolCall) -> Verdict:
        if len(call.args) > self.max_arg_bytes:
            return Verdict.deny(Reason.OVERSIZE, self.by, f"args are {len(call.args)} bytes > {self.max_arg_bytes}")
        plan = self._plans.get(call.tool) or self._plan(call.tool)
        if plan.denied:
            return Verdict.deny(Reason.POLICY_BLOCK, self.by, f"tool {call.tool!r} is denied")
        if not plan.known:
            if self.default == "defer":
                return self._defer_v
            return Verdict.deny(Reason.UNKNOWN_TOOL, self.by, f"tool {call.tool!r} is not allowed")
        for chk in plan.checks:
            text = call.args_text if chk.field is None else _field_value(call.args_obj, chk.field)
            if text is None:
                continue
            hits = [i for n, i in chk.needles if n in text]
            norm = text
            if chk.normalizes:
                norm = shell_normalize(text)
                if norm != text:
                    hits += [i for n, i in chk.norm_needles if n in norm]
                else:
                    norm = text
            if chk.always:
                hits += chk.always
            if hits:
                for i in sorted(set(hits)):  # policy order decides which rule names the reason
                    r = chk.rules[i]
                    if r.regex is not None and (
                        r.regex.search(text) is not None
                        or (r.normalize and norm is not text and r.regex.search(norm) is not None)
                    ):
                        return r.verdict or Verdict.deny(r.reason, self.by, r.detail or f"arg rule {r.id}")
        if plan.write_fields:
            hit = self._self_modify_hit(call, plan.write_fields)
            if hit is not None:
                return Verdict.deny(Reason.SELF_MODIFY, self.by, f"write to protected path {hit}")
        if self.model is not None and self.effect_rules and self.model.knows(call.tool):
            v = self._judge_effects(call)
            if v is not None:
                return v
        for lim in plan.limits:
            wait = lim.take()
            if wait is not None:
                return Verdict.deny(Reason.RATE_LIMITED, self.by,
                                    f"rate limit {lim.id}: {lim.per_minute:g}/min, retry in {wait:.1f}s")
        for r in plan.witness:
            if _matches(r, call):
                return Verdict.of(VerdictKind.REQUIRE_WITNESS, Reason.UNWITNESSED, self.by, r.detail or f"rule {r.id}")
        if plan.transforms:
            new = self._transform(call, plan.transforms)
            if new is not None:
                return Verdict.of(VerdictKind.TRANSFORM, Reason.REDACTED, self.by, new[1], new[0])
        return self._allow_v

    def _judge_effects(self, call: ToolCall) -> Verdict | None:
        """The most restrictive effect rule any of the call's effects meets (None: no rule objects)."""
        assert self.model is not None
        try:
            effects = self.model.effects(call)
        except ShellParseError as exc:
            reason = Reason.MALFORMED if self.unparseable is VerdictKind.DENY else Reason.UNWITNESSED
            return Verdict.of(self.unparseable, reason, self.by, f"unparseable shell: {exc}")
        hits: list[tuple[int, int, EffectRule, Any]] = []
        for e in effects:
            r = self._effect_rule(e.kind, e.cls, call.tool)
            if r is not None and r.verdict is not VerdictKind.ALLOW:  # an allow rule exempts the effect
                hits.append((RANK[r.verdict], _NAMES_FIRST.get(e.kind, 0), r, e))
        if not hits:
            return None
        # The most restrictive verdict; among equals the effect that says most (the rm under a sudo)
        hits.sort(key=lambda h: (h[0], h[1]), reverse=True)
        _, _, r, e = hits[0]
        how = f" [{e.how}]" if e.how else ""
        also = [x for x in dict.fromkeys(str(h[3]) for h in hits[1:]) if x != str(e)][:2]  # each named once
        detail = f"{e} by {r.id}{how}" + (f": {r.detail}" if r.detail else "") + (f" (also: {'; '.join(also)})" if also else "")
        if r.verdict is VerdictKind.DENY:
            return Verdict.deny(r.reason, self.by, detail)
        return Verdict.of(r.verdict, Reason.UNWITNESSED if r.reason is Reason.POLICY_BLOCK else r.reason, self.by, detail)

    def _effect_rule(self, kind: str, cls: str, tool: str) -> EffectRule | None:
        """The first effect rule that names (kind, class) for this tool; remembered, as the rules are fixed."""
        key = (kind, cls, tool)
        try:
            return self._rule_of[key]
        except KeyError:
            pass
        r = next((r for r in self.effect_rules if r.matches(kind, cls, tool)), None)
        if len(self._rule_of) >= _PLAN_CACHE_MAX:
            self._rule_of.clear()
        self._rule_of[key] = r
        return r

    def write_targets(self, call: ToolCall, fields: list[str]) -> list[str]:
        out: list[str] = []
        for f in fields:
            if f == "@patch":
                text = call.args_text
                if "*** " in text:
                    out += [a or b for a, b in _PATCH_HDR.findall(text)]
            elif f == "@redirect":
                text = call.args_text
                if ">" in text or "tee" in text:  # every _REDIRECT match contains one of these
                    out += [m.group(2) or m.group(3) for m in _REDIRECT.finditer(text)]
            else:
                v = _field_value(call.args_obj, tuple(f.split(".")))
                if v:
                    out.append(v)
        return out

    def _self_modify_hit(self, call: ToolCall, fields: list[str]) -> str | None:
        assert self.self_modify is not None
        targets = self.write_targets(call, fields)
        if not targets:
            return None
        cwd = None
        trigger = self._sm_trigger
        for t in targets:
            p = t.strip("\"'")
            if p.startswith("$"):
                p = _HOME_VAR.sub("~", p, count=1)
            if p.startswith("~"):
                p = os.path.expanduser(p)
            if not p.startswith("/"):
                if cwd is None:
                    cwd = str(call.meta.get("cwd") or os.getcwd())
                p = cwd + "/" + p
            p = os.path.normpath(p)
            if (
                self._sm_any or p.startswith(self._sm_prefixes) or (trigger is not None and trigger.search(p) is not None)
            ) and self.self_modify.match(p):
                return t
        return None

    def _transform(self, call: ToolCall, rules: list[ArgRule]) -> tuple[bytes, str] | None:
        obj = call.args_obj
        changed: list[str] = []
        new = obj
        for r in rules:
            for path in r.redact:
                if _field_value(new, path) is not None:
                    new = new if new is not obj else copy.deepcopy(obj)
                    _set_field(new, path, r.replace)
                    changed.append(".".join(path))
            if r.regex is not None and r.field is not None:
                v = _field_value(new, r.field)
                if v is not None:
                    nv = r.regex.sub(r.replace, v)
                    if nv != v:
                        new = new if new is not obj else copy.deepcopy(obj)
                        _set_field(new, r.field, nv)
                        changed.append(".".join(r.field))
        if not changed:
            return None
        raw = json.dumps(new, separators=(",", ":"), ensure_ascii=False).encode()
        return raw, "redacted " + ", ".join(dict.fromkeys(changed))

    # -- result admitter ---------------------------------------------------------------------
    def admit_result(self, call: ToolCall, result: Result) -> Verdict:
        if self.quarantine is None and not self.result_deny:
            return self._allow_v
        text = result.text
        for r in self.result_deny:
            if r.regex is not None and r.regex.search(text):
                return Verdict.deny(r.reason, self.by, r.detail or f"result rule {r.id}")
        if self.quarantine is not None:
            m = self.quarantine.search(text)
            if m:
                return Verdict.of(VerdictKind.QUARANTINE, Reason.PROMPT_INJECTION, self.by, f"result matches {m.group(0)[:60]!r}")
        return self._allow_v


def _set_field(obj: Any, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


# -- loading -----------------------------------------------------------------------------------
class _Loader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> FakError:
        return FakError(f"{self.source}: policy field {where!r}: {problem}")

    def str_list(self, obj: dict[str, Any], key: str) -> list[str]:
        v = obj.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(key, "expected a list of strings")
        return v

    def regex(self, where: str, pat: Any) -> re.Pattern[str]:
        if not isinstance(pat, str) or not pat:
            raise self.fail(where, "expected a non-empty regex string")
        try:
            return re.compile(pat)
        except re.error as exc:
            raise self.fail(where, f"bad regex: {exc}") from None

    def rule(self, key: str, i: int, r: Any, *, need_pattern: bool, default_reason: Reason) -> ArgRule:
        where = f"{key}[{i}]"
        if not isinstance(r, dict):
            raise self.fail(where, "expected an object")
        tools = r.get("tools", "*")
        if tools == "*" or tools == ["*"]:
            tset = None
        elif isinstance(tools, list) and all(isinstance(t, str) for t in tools):
            tset = frozenset(tools)
        else:
            raise self.fail(f"{where}.tools", 'expected a list of tool names or "*"')
        fld = r.get("field")
        if fld is not None and (not isinstance(fld, str) or not fld):
            raise self.fail(f"{where}.field", "expected a dotted field name")
        pat = r.get("pattern")
        regex = self.regex(f"{where}.pattern", pat) if (pat is not None or need_pattern) else None
        reason = default_reason
        if "reason" in r:
            try:
                reason = Reason(r["reason"])
            except ValueError:
                raise self.fail(f"{where}.reason",
                                f"unknown reason {r['reason']!r} (known: {', '.join(x.value for x in Reason)})") from None
        redact = r.get("redact", [])
        if not isinstance(redact, list) or not all(isinstance(x, str) and x for x in redact):
            raise self.fail(f"{where}.redact", "expected a list of field names")
        replace = r.get("replace", "[REDACTED]")
        if not isinstance(replace, str):
            raise self.fail(f"{where}.replace", "expected a string")
        detail = r.get("detail", "")
        if not isinstance(detail, str):
            raise self.fail(f"{where}.detail", "expected a string")
        norm = r.get("normalize")
        if norm is not None:
            if key not in ("arg_rules", "require_witness"):
                raise self.fail(f"{where}.normalize", "only arg_rules and require_witness rules normalize")
            if norm != "shell":
                raise self.fail(f"{where}.normalize", f"unknown normal form {norm!r} (known: shell)")
        return ArgRule(
            id=str(r.get("id", f"{key}[{i}]")), tools=tset, field=tuple(fld.split(".")) if fld else None,
            regex=regex, reason=reason, detail=detail, redact=tuple(tuple(x.split(".")) for x in redact), replace=replace,
            normalize=norm is not None,
        )

    def rate_limits(self, obj: dict[str, Any]) -> list[RateLimit]:
        v = obj.get("rate_limits", [])
        if not isinstance(v, list):
            raise self.fail("rate_limits", "expected a list of rule objects")
        out = []
        for i, r in enumerate(v):
            where = f"rate_limits[{i}]"
            rule = self.rule("rate_limits", i,
                             {k: x for k, x in r.items() if k not in ("per_minute", "burst")} if isinstance(r, dict) else r,
                             need_pattern=False, default_reason=Reason.RATE_LIMITED)
            pm, burst = r.get("per_minute"), r.get("burst", 1)
            if not isinstance(pm, (int, float)) or isinstance(pm, bool) or pm <= 0:
                raise self.fail(f"{where}.per_minute", "expected a positive number")
            if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
                raise self.fail(f"{where}.burst", "expected an integer >= 1")
            out.append(RateLimit(rule.id, rule.tools, float(pm), burst))
        return out

    def model(self, obj: dict[str, Any]) -> ToolModel:
        v = obj.get("effects", {})
        if not isinstance(v, dict):
            raise self.fail("effects", "expected {family: {tool: field}}")
        fams = dict(DEFAULT_MODEL)
        for fam, table in v.items():
            if fam not in fams:
                raise self.fail(f"effects.{fam}", f"unknown tool family (known: {', '.join(fams)})")
            if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(x, str) and x for k, x in table.items()):
                raise self.fail(f"effects.{fam}", "expected {tool: dotted field}")
            fams[fam] = table
        return ToolModel(**{k: dict(t) for k, t in fams.items()})

    def effect_rules(self, obj: dict[str, Any]) -> list[EffectRule]:
        v = obj.get("effect_rules", [])
        if not isinstance(v, list):
            raise self.fail("effect_rules", "expected a list of rule objects")
        out = []
        for i, r in enumerate(v):
            where = f"effect_rules[{i}]"
            if not isinstance(r, dict):
                raise self.fail(where, "expected an object")
            odd = sorted(set(r) - {"id", "effect", "target", "verdict", "reason", "tools", "detail"})
            if odd:
                raise self.fail(f"{where}.{odd[0]}", "unknown field (known: id, effect, target, verdict, reason, tools, detail)")
            kinds = r.get("effect")
            kinds = [kinds] if isinstance(kinds, str) else kinds
            if not isinstance(kinds, list) or not kinds or not all(k in KINDS for k in kinds):
                raise self.fail(f"{where}.effect", f"expected effect kinds from: {', '.join(KINDS)}")
            classes = r.get("target")
            classes = [classes] if isinstance(classes, str) else classes
            if classes is not None and (not isinstance(classes, list) or not all(c in CLASSES for c in classes)):
                raise self.fail(f"{where}.target", f"expected target classes from: {', '.join(CLASSES)}")
            verdict = r.get("verdict", "deny")
            if verdict not in _EFFECT_VERDICTS:
                raise self.fail(f"{where}.verdict", "expected 'deny', 'witness' or 'allow'")
            try:
                reason = Reason(r.get("reason", "POLICY_BLOCK"))
            except ValueError:
                raise self.fail(f"{where}.reason", f"unknown reason {r.get('reason')!r}") from None
            tools = r.get("tools", "*")
            if tools not in ("*", ["*"]) and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
                raise self.fail(f"{where}.tools", 'expected a list of tool names or "*"')
            detail = r.get("detail", "")
            if not isinstance(detail, str):
                raise self.fail(f"{where}.detail", "expected a string")
            out.append(EffectRule(str(r.get("id", where)), frozenset(kinds), frozenset(classes) if classes is not None else None,
                                  _EFFECT_VERDICTS[verdict], reason,
                                  None if tools in ("*", ["*"]) else frozenset(tools), detail))
        return out

    def unparseable(self, obj: dict[str, Any]) -> VerdictKind:
        v = obj.get("unparseable", "deny")
        if v not in ("deny", "witness"):
            raise self.fail("unparseable", "expected 'deny' or 'witness'")
        return _EFFECT_VERDICTS[v]

    def rules(self, obj: dict[str, Any], key: str, *, need_pattern: bool, default_reason: Reason) -> list[ArgRule]:
        v = obj.get(key, [])
        if not isinstance(v, list):
            raise self.fail(key, "expected a list of rule objects")
        return [self.rule(key, i, r, need_pattern=need_pattern, default_reason=default_reason) for i, r in enumerate(v)]


def parse_policy(obj: Any, source: str = "<policy>") -> Policy:
    """A policy dict -> Policy. Every problem is a FakError naming the source and the field."""
    ld = _Loader(source)
    if not isinstance(obj, dict):
        raise FakError(f"{source}: policy must be a JSON object")
    version = obj.get("version")
    if version not in (VERSION, VERSION_2):
        raise ld.fail("version", f"expected {VERSION!r} or {VERSION_2!r}, got {version!r}")
    known = _KNOWN_FIELDS | (_V2_FIELDS if version == VERSION_2 else set())
    unknown = sorted(set(obj) - known)
    if unknown:
        hint = f" ({unknown[0]!r} needs {VERSION_2!r})" if unknown[0] in _V2_FIELDS else ""
        raise ld.fail(unknown[0], f"unknown field{hint} (known: {', '.join(sorted(known))})")
    default = obj.get("default", "deny")
    if default not in ("deny", "allow", "defer"):
        raise ld.fail("default", f"expected 'deny', 'allow' or 'defer', got {default!r}")
    mab = obj.get("max_arg_bytes", 1 << 20)
    if not isinstance(mab, int) or isinstance(mab, bool) or mab <= 0:
        raise ld.fail("max_arg_bytes", "expected a positive integer")
    globs = ld.str_list(obj, "self_modify")
    wt = obj.get("write_tools", {})
    if not isinstance(wt, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in wt.values()):
        raise ld.fail("write_tools", "expected {tool: [field, ...]}")
    for tool, fields in wt.items():
        odd = [f for f in fields if f.startswith("@") and f not in ("@patch", "@redirect")]
        if odd:  # a typo here would silently switch the self-modify check off for that tool
            raise ld.fail(f"write_tools.{tool}", f"unknown target {odd[0]!r} (known: @patch, @redirect, or a field name)")
    qp = ld.str_list(obj, "quarantine_patterns")
    for i, p in enumerate(qp):
        ld.regex(f"quarantine_patterns[{i}]", p)
    name = obj.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise ld.fail("name", "expected a string")
    return Policy(
        name=name, source=source, default=default, max_arg_bytes=mab,
        allow=frozenset(ld.str_list(obj, "allow")), allow_prefix=tuple(ld.str_list(obj, "allow_prefix")),
        deny=frozenset(ld.str_list(obj, "deny")),
        arg_rules=ld.rules(obj, "arg_rules", need_pattern=True, default_reason=Reason.POLICY_BLOCK),
        self_modify=re.compile("|".join(fnmatch.translate(os.path.expanduser(g)) for g in globs)) if globs else None,
        self_modify_globs=tuple(globs), write_tools={k: list(v) for k, v in wt.items()},
        rate_limits=ld.rate_limits(obj),
        require_witness=ld.rules(obj, "require_witness", need_pattern=False, default_reason=Reason.UNWITNESSED),
        transforms=ld.rules(obj, "transforms", need_pattern=False, default_reason=Reason.REDACTED),
        quarantine=combine(qp) if qp else None,
        result_deny=ld.rules(obj, "result_deny", need_pattern=True, default_reason=Reason.SECRET_EXFIL),
        model=ld.model(obj) if version == VERSION_2 else None,
        effect_rules=ld.effect_rules(obj) if version == VERSION_2 else [],
        unparseable=ld.unparseable(obj),
        version=version,
    )


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read and compile a policy file; one-line FakError naming the file (and field) on any problem."""
    return parse_policy(read_json(path, "policy"), str(path))


FLOOR_NAME = "coding-floor.json"
FLOOR_V1_NAME = "coding-floor-v1.json"  # the regex floor v2 replaced, kept to compare (bench/decide.py)


def coding_floor(name: str = FLOOR_NAME) -> Policy:
    """The default coding floor shipped inside the package (fak/core/policies/coding-floor.json)."""
    ref = resources.files("fak.core.policies").joinpath(name)
    return parse_policy(json.loads(ref.read_text(encoding="utf-8")), f"fak/core/policies/{name}")


def serving_floor() -> Policy:
    """The coding floor as fak serve applies it to a model's proposed calls: the request names the
    tools it offers (the gateway refuses any other), so an offered tool is known (default allow);
    every argument rule, self-modify guard and limit of the floor still applies."""
    import dataclasses

    return dataclasses.replace(coding_floor(), default="allow", _plans={})
