"""Append-only, hash-chained JSONL journal of kernel decisions.

Line format (ASCII, compact JSON, one record per line):
    {"n":1,"time":...,"phase":"submit","seq_no":1,"trace_id":"","tool":"Bash","verdict":"ALLOW",
     "reason":"NONE","by":"policy:x","args_sha256":"...","prev":"<hash of record n-1>","hash":"<sha256>"}
`hash` is the sha256 of the exact line bytes without the `,"hash":"..."` suffix (i.e. the body ending in
`}`), so flipping any byte of a record breaks that record itself; `prev` chains the records (the first
record's prev is 64 zeros), so deleting or reordering records breaks the next one.

Crash safety: a record is one `write` of the whole line followed by flush (+ fsync by default), so a
crash can only leave a torn *last* line. `verify` reports such a tail as truncated - not a chain
break: every earlier record still verifies. Opening a journal for append cuts a torn tail off (that
record was never acknowledged) and notes the cut bytes in the next record (`recovered_torn_bytes`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fak.core.abi import ToolCall, Verdict
from fak.errors import FakError

GENESIS = "0" * 64
_SUFFIX = re.compile(rb',"hash":"([0-9a-f]{64})"\}')
_PRINTABLE = re.compile(rb"^[\x20-\x7e]*$")


def _seal(fields: dict[str, Any]) -> tuple[bytes, str]:
    body = json.dumps(fields, separators=(",", ":"), ensure_ascii=True, default=str).encode()
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"hash":"' + digest.encode() + b'"}\n', digest


def _last_line(path: Path) -> tuple[bytes, int]:
    """(last complete line without newline, size of the torn tail after it) read from the file's end."""
    size = path.stat().st_size
    with path.open("rb") as f:
        chunk = 1 << 16
        while True:
            start = max(0, size - chunk)
            f.seek(start)
            data = f.read(size - start)
            end = data.rfind(b"\n")
            torn = len(data) - end - 1 if end >= 0 else len(data)
            prev_nl = data.rfind(b"\n", 0, end) if end >= 0 else -1
            if (end >= 0 and prev_nl >= 0) or start == 0:
                line = data[prev_nl + 1 : end] if end >= 0 else b""
                return line, torn
            chunk *= 4


class Journal:
    """Appends decision records. Thread-safe; one process should own a journal file at a time."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._prev = GENESIS
        self._n = 0
        self._recovered = 0
        try:
            if self.path.exists() and self.path.stat().st_size > 0:
                self._resume()
            self._f = self.path.open("ab")
        except OSError as exc:
            raise FakError(f"{self.path}: cannot open journal: {exc.strerror or exc}") from None

    def _resume(self) -> None:
        line, torn = _last_line(self.path)
        size = self.path.stat().st_size
        not_ours = FakError(f"{self.path}: last journal record is not a fak journal record; run `fak audit verify`")
        if torn:  # only a torn fak record may be cut off: never a line of some other file
            with self.path.open("rb") as f:
                f.seek(size - torn)
                tail = f.read(torn)
            head = b'{"n":'
            if tail[: len(head)] != head[: len(tail)] or not _PRINTABLE.match(tail):
                raise not_ours
        if line:
            m = _SUFFIX.search(line)
            try:
                rec = json.loads(line[: m.start()] + b"}") if m else None
            except ValueError:
                rec = None
            if m is None or not isinstance(rec, dict):
                raise not_ours
            self._prev, self._n = m.group(1).decode(), int(rec.get("n", 0))
        if torn:
            with self.path.open("r+b") as f:
                f.truncate(size - torn)
            self._recovered = torn

    def append(self, fields: dict[str, Any]) -> str:
        """Append one record (fields + n, time, prev); returns its hash."""
        with self._lock:
            rec = {"n": self._n + 1, "time": round(time.time(), 6), **fields}
            if self._recovered:
                rec["recovered_torn_bytes"], self._recovered = self._recovered, 0
            rec["prev"] = self._prev
            line, digest = _seal(rec)
            try:
                self._f.write(line)  # one write of the whole line: a crash tears at most this line
                self._f.flush()
                if self.fsync:
                    os.fsync(self._f.fileno())
            except (OSError, ValueError) as exc:  # disk full, closed file: no record, so no decision
                raise FakError(f"{self.path}: journal write failed: {exc}") from None
            self._prev, self._n = digest, self._n + 1
            return digest

    def record(self, call: ToolCall, verdict: Verdict, phase: str = "submit") -> str:
        return self.append({
            "phase": phase,
            "seq_no": call.seq_no,
            "trace_id": call.trace_id,
            "tool": call.tool,
            "verdict": verdict.kind.value,
            "reason": verdict.reason.value,
            "by": verdict.by,
            "args_sha256": hashlib.sha256(call.args).hexdigest(),
        })

    def close(self) -> None:
        with self._lock:
            self._f.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class VerifyReport:
    ok: bool  # every complete record verifies (a truncated tail does not make this False)
    records: int  # records that verified
    bad_line: int | None = None  # first broken line (1-based)
    problem: str = ""
    truncated_line: int | None = None  # a torn last line (crash mid-write), reported, not a break

    def summary(self, path: str) -> str:
        if not self.ok:
            return f"{path}: BROKEN at line {self.bad_line}: {self.problem} ({self.records} records before it verify)"
        tail = f"; line {self.truncated_line} is truncated (torn write), ignored" if self.truncated_line else ""
        return f"{path}: OK, {self.records} records{tail}"


def _check_line(line: bytes, n: int, prev: str) -> tuple[str | None, str]:
    """(problem or None, this record's hash)."""
    m = _SUFFIX.search(line)
    if m is None or m.end() != len(line):
        return "not a sealed record (no trailing hash)", ""
    body = line[: m.start()] + b"}"
    digest = m.group(1).decode()
    if hashlib.sha256(body).hexdigest() != digest:
        return "hash mismatch (record altered)", digest
    try:
        rec = json.loads(body)
    except ValueError:
        return "record is not valid JSON", digest
    if not isinstance(rec, dict):
        return "record is not a JSON object", digest
    if rec.get("prev") != prev:
        return "prev does not match the previous record's hash (chain broken)", digest
    if rec.get("n") != n:
        return f"record number {rec.get('n')!r}, expected {n}", digest
    return None, digest


def verify_bytes(data: bytes) -> VerifyReport:
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    prev, n = GENESIS, 0
    for i, line in enumerate(lines, start=1):
        problem, digest = _check_line(line, n + 1, prev)
        if problem:
            return VerifyReport(False, n, i, problem)
        prev, n = digest, n + 1
    if tail:
        i = len(lines) + 1
        m = _SUFFIX.search(tail)
        if m is not None:  # a complete record: either it verifies (only its newline is missing) or it is broken
            problem, _ = _check_line(tail, n + 1, prev)
            if problem:
                return VerifyReport(False, n, i, problem)
            return VerifyReport(True, n + 1, problem="missing final newline")
        if not _PRINTABLE.match(tail) or not tail.startswith(b"{"):
            return VerifyReport(False, n, i, "garbage after the last record")
        return VerifyReport(True, n, truncated_line=i, problem="truncated last line")
    return VerifyReport(True, n)


def verify(path: str | os.PathLike[str]) -> VerifyReport:
    """Verify a journal file; FakError (one line) if it cannot be read at all."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FakError(f"{path}: no such journal file") from None
    except IsADirectoryError:
        raise FakError(f"{path}: is a directory, expected a journal file") from None
    except OSError as exc:
        raise FakError(f"{path}: cannot read journal: {exc.strerror or exc}") from None
    return verify_bytes(data)
