"""The one seccomp filter the sandbox loads: ioctl(TIOCSTI) and ioctl(TIOCLINUX) refused with EPERM.

An interactive agent keeps the terminal (it needs SIGWINCH, job control and Ctrl-C), so the sandbox cannot
take it away with setsid (bwrap --new-session); then TIOCSTI would let a command inside push keystrokes
into the shell the user returns to (CVE-2017-5226; Linux 6.2+ can turn it off with
dev.tty.legacy_tiocsti=0, many kernels do not). Flatpak closes it the same way. The filter is classic
BPF as bwrap --seccomp reads it (an array of struct sock_filter), written here by hand: x86-64 (and its
x32 and i386 ABIs) and aarch64 (and arm); any other architecture's calls pass.
"""

from __future__ import annotations

import os
import struct
import sys

TIOCSTI, TIOCLINUX = 0x5412, 0x541C
EPERM = 1
_LD_ABS, _JEQ, _RET = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_ARG1 = 16 + 8 + (0 if sys.byteorder == "little" else 4)  # the low 32 bits of args[1] (ioctl's request)
# architecture (AUDIT_ARCH_*) -> ioctl's syscall numbers in that ABI
IOCTL = {0xC000003E: (16, 0x40000000 | 514), 0x40000003: (54,), 0xC00000B7: (29,), 0x40000028: (54,)}

Insn = tuple[int, str | int, str | int, int]  # (code, jump-if-true, jump-if-false, k); jumps by label


def _program() -> list[Insn]:
    prog: list[Insn] = [(_LD_ABS, 0, 0, _ARCH)]
    prog += [(_JEQ, f"arch{i}", 0, arch) for i, arch in enumerate(IOCTL)]
    prog.append((_RET, 0, 0, _ALLOW))
    labels: dict[str, int] = {}
    for i, nrs in enumerate(IOCTL.values()):
        labels[f"arch{i}"] = len(prog)
        prog.append((_LD_ABS, 0, 0, _NR))
        prog += [(_JEQ, "check", 0, nr) for nr in nrs]
        prog.append((_RET, 0, 0, _ALLOW))
    labels["check"] = len(prog)
    prog += [(_LD_ABS, 0, 0, _ARG1), (_JEQ, "deny", 0, TIOCSTI), (_JEQ, "deny", 0, TIOCLINUX), (_RET, 0, 0, _ALLOW)]
    labels["deny"] = len(prog)
    prog.append((_RET, 0, 0, _ERRNO | EPERM))
    out: list[Insn] = []
    for at, (code, jt, jf, k) in enumerate(prog):  # a jump is relative to the next instruction
        out.append((code, *(labels[j] - at - 1 if isinstance(j, str) else j for j in (jt, jf)), k))  # type: ignore[arg-type]
    return out


def tiocsti_filter() -> bytes:
    """The compiled program: struct sock_filter {u16 code; u8 jt; u8 jf; u32 k} in native byte order."""
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in _program())  # type: ignore[arg-type]


def filter_fd() -> int:
    """A pipe's read end holding the program (bwrap reads it to EOF), inheritable by the spawned bwrap;
    the caller closes it once bwrap has started."""
    r, w = os.pipe()
    try:
        os.write(w, tiocsti_filter())
    finally:
        os.close(w)
    os.set_inheritable(r, True)
    return r
