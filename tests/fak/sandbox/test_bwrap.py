"""The bubblewrap argv from a SandboxSpec (pure: mount order, namespaces, the relay as init), what
contain() finds on disk (credential stores, the agent's own token left to it, paths under /tmp kept
visible), the seccomp program's shape; then real bwrap runs of the sandbox engine's Bash: a write
outside the project, a planted key, the host's loopback and a private /tmp, each with and without it."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

import pytest

from fak.errors import FakError
from fak.sandbox import Relay, SandboxSpec, bwrap_argv, contain, find_bwrap
from fak.sandbox.bwrap import RELAY, program_roots
from fak.sandbox.seccomp import filter_fd, tiocsti_filter
from fak.tools.shell import run_shell
from support.loopback import LoopbackServer

needs_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_argv_mounts_in_order_and_namespaces() -> None:
    spec = SandboxSpec(project=Path("/w/proj"), home=Path("/h"), writable=(Path("/h/.claude"), Path("/h/.claude.json")),
                       readonly=(Path("/w/proj/.fak/guard"),), hidden=(Path("/h/.ssh"), Path("/h/.netrc")),
                       hidden_files=frozenset({Path("/h/.netrc")}),
                       empty=Path("/tmp/empty"), visible=(Path("/tmp/h"),), env={"HTTPS_PROXY": "http://127.0.0.1:3128"})
    a = bwrap_argv(spec, ["bash", "-c", "true"], bwrap="/usr/bin/bwrap")
    assert a[0] == "/usr/bin/bwrap" and a[-4:] == ["--", "bash", "-c", "true"]
    for flag in ("--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--new-session"):
        assert flag in a
    assert pairs(a, "--cap-drop") == ["ALL"] and "--as-pid-1" not in a  # no relays: bwrap's own init
    i = a.index
    # read-only root, then private tmps, then what shows through them, then writable, then the masks
    assert (i("--ro-bind") < i("--tmpfs") < i("/tmp/h") < i("/w/proj") < i("/h/.claude") < i("/w/proj/.fak/guard")
            < i("/h/.ssh") < i("/h/.netrc"))
    j = i("/w/proj/.fak/guard")
    assert a[j - 1:j + 2] == ["--ro-bind", "/w/proj/.fak/guard", "/w/proj/.fak/guard"]  # the journal, inside rw
    assert pairs(a, "--tmpfs")[:2] == ["/tmp", "/var/tmp"]
    assert pairs(a, "--bind") == ["/w/proj", "/h/.claude", "/h/.claude.json"]
    assert a[i("/h/.ssh") - 1] == "--tmpfs" and pairs(a, "--remount-ro") == ["/h/.ssh"]
    assert a[i("/h/.netrc") - 2:i("/h/.netrc")] == ["--ro-bind", "/tmp/empty"]  # an empty file over a file
    assert pairs(a, "--setenv") == ["HTTPS_PROXY"] and pairs(a, "--chdir") == ["/w/proj"]


def test_argv_with_relays_runs_the_relay_as_init() -> None:
    relays = (Relay("gateway", 4100, Path("/tmp/s/gateway.sock")), Relay("proxy", 3128, Path("/tmp/s/proxy.sock")))
    spec = SandboxSpec(project=Path("/w"), home=Path("/h"), relays=relays, new_session=False, python="/py")
    a = bwrap_argv(spec, ["claude", "-p", "hi"], info_fd=5, seccomp_fd=6)
    assert "--as-pid-1" in a and "--new-session" not in a
    assert pairs(a, "--info-fd") == ["5"] and pairs(a, "--seccomp") == ["6"]
    assert a[a.index("/tmp/s") - 1] == "--ro-bind"  # the socket directory, once
    tail = a[a.index("--") + 1:]
    assert tail == ["/py", "-I", "-S", str(RELAY), "--listen", "4100=/tmp/s/gateway.sock", "--listen",
                    "3128=/tmp/s/proxy.sock", "--", "claude", "-p", "hi"]


def test_contain_finds_credentials_and_leaves_the_agent_its_own(tmp_path: Path) -> None:
    home, proj = tmp_path / "home", tmp_path / "proj"
    proj.mkdir()
    for d in (".ssh", ".aws", ".config/gh", ".claude"):
        (home / d).mkdir(parents=True)
    (home / ".netrc").write_text("machine x password y\n")
    (home / ".claude" / ".credentials.json").write_text("{}")
    (home / ".git-credentials").symlink_to(home / "elsewhere")  # dangling: nothing to hide
    (proj / "journal.jsonl").write_text("")
    (tmp_path / "outside.jsonl").write_text("")
    spec = contain(proj, home, writable=(home / ".claude", home / ".claude.json"),
                   readonly=(proj / "journal.jsonl", tmp_path / "outside.jsonl"))
    assert spec.readonly == ((proj / "journal.jsonl").resolve(),)  # only what would be writable
    mine = {p for p in spec.hidden if home in p.parents}
    assert mine == {home / ".ssh", home / ".aws", home / ".config/gh", home / ".netrc"}
    assert spec.hidden_files & mine == {home / ".netrc"} and spec.empty.stat().st_size == 0
    assert spec.writable == (home / ".claude",)  # ~/.claude.json does not exist: not bound
    assert home in spec.visible  # the HOME under /tmp shows through the private /tmp
    assert spec.project == proj.resolve() and spec.new_session


@pytest.mark.parametrize("where", ["/", "~"])
def test_the_project_is_not_a_whole_home_or_root(where: str) -> None:
    with pytest.raises(FakError, match="the project directory is .*pass --sandbox off"):
        contain(os.path.expanduser(where), os.path.expanduser("~"))


def test_seccomp_program_is_well_formed() -> None:
    prog = tiocsti_filter()
    assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 64
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    for at, (code, jt, jf, _k) in enumerate(insns):
        if code == 0x15:  # every conditional jump lands inside the program
            assert at + 1 + max(jt, jf) < len(insns)
    assert insns[-1] == (0x06, 0, 0, 0x00050001)  # the last word: EPERM


@needs_bwrap
def test_seccomp_refuses_tiocsti_on_the_controlling_terminal() -> None:
    probe = ("import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('injected')\n"
             "except OSError as e:\n    print('refused', e.errno)\n")
    out = {}
    for name in ("plain", "filtered"):
        master, slave = pty.openpty()
        fd = filter_fd() if name == "filtered" else None

        def ctty() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                *(["--seccomp", str(fd)] if fd is not None else []), "--", sys.executable, "-c", probe]
        r = subprocess.run(argv, stdin=slave, capture_output=True, text=True, timeout=30, preexec_fn=ctty,
                           pass_fds=(fd,) if fd is not None else ())
        os.close(slave)
        os.close(master)
        if fd is not None:
            os.close(fd)
        out[name] = r.stdout.strip()
    assert out["filtered"] == "refused 1"
    legacy = Path("/proc/sys/dev/tty/legacy_tiocsti")
    if legacy.exists() and legacy.read_text().strip() == "1":
        assert out["plain"] == "injected"  # the hole the filter closes is open on this kernel


@needs_bwrap
def test_the_engines_bash_in_and_out_of_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, proj, outside = tmp_path / "home", tmp_path / "proj", tmp_path / "outside"
    for d in (home / ".ssh", proj, outside):
        d.mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / "canary").write_text("alive\n")
    monkeypatch.setenv("HOME", str(home))  # the user's home, as the engine's caller has it
    lis = LoopbackServer()
    cmd = (f"echo in > inside.txt; cat {home}/.ssh/id_ed25519; echo out > {outside}/x.txt; "
           f"curl -s -m 5 http://127.0.0.1:{lis.port}/ || echo no-network; echo t > /tmp/fak-sandbox-probe; "
           f"rm -rf {home}")
    ro_probe = "; touch /usr/fak-sandbox-probe"  # outside /tmp, the file system is there but read-only
    spec = contain(proj, proj)
    boxed = run_shell(cmd + ro_probe, proj, proj, 30, spec, find_bwrap() or "bwrap")
    assert (proj / "inside.txt").read_text() == "in\n"  # the project is writable
    assert "PRIVATE KEY" not in boxed.output and "No such file" in boxed.output
    assert not (outside / "x.txt").exists()  # under the host's /tmp: not even there
    assert "/usr/fak-sandbox-probe': Read-only file system" in boxed.output
    assert lis.hits == 0 and "no-network" in boxed.output
    assert not Path("/tmp/fak-sandbox-probe").exists()  # a private /tmp
    assert (home / "canary").read_text() == "alive\n"
    plain = run_shell(cmd, proj, proj, 30)  # the same command, no sandbox
    assert "PRIVATE KEY" in plain.output and (outside / "x.txt").exists() and lis.hits == 1
    assert not home.exists()
    Path("/tmp/fak-sandbox-probe").unlink(missing_ok=True)


@needs_bwrap
@pytest.mark.slow
def test_a_timeout_kills_everything_inside(tmp_path: Path) -> None:
    spec = contain(tmp_path, tmp_path)
    r = run_shell("(sleep 30; echo late > late.txt) & sleep 30", tmp_path, tmp_path, 1.0, spec)
    assert r.timed_out and r.exit_code is None
    r = run_shell("(sleep 2; echo late > late2.txt) & echo quick", tmp_path, tmp_path, 10.0, spec)
    assert r.output.strip() == "quick" and not r.timed_out
    import time

    time.sleep(2.5)
    assert not (tmp_path / "late.txt").exists() and not (tmp_path / "late2.txt").exists()


def test_program_roots_are_the_tmp_entries_holding_the_agents_files(tmp_path: Path) -> None:
    entry = Path("/tmp") / tmp_path.resolve().relative_to("/tmp").parts[0]  # pytest's own tmp root
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "agent.py").write_text("print('ran')\n")
    (tool / "agent.py").chmod(0o755)
    (tool / "agent").symlink_to(tool / "agent.py")
    assert program_roots(["python3", str(tool / "agent.py"), "--flag", str(tmp_path / "missing")]) == [entry]
    assert program_roots(["agent", "-p", "hi"], path=f"/nonexistent:{tool}") == [entry]  # found on PATH
    assert program_roots(["python3", "-c", "print(1)"]) == []  # nothing under /tmp: nothing to show
    assert program_roots([str(tool)]) == []  # a directory argument is not a program's file
    assert program_roots(["cat", "/etc/hostname", str(tool / "agent.py")]) == []  # a later argument is data


@needs_bwrap
def test_an_agent_installed_under_tmp_runs_and_the_rest_of_tmp_stays_private(tmp_path: Path) -> None:
    """A checkout or venv under /tmp holding the agent: the private /tmp must not hide the agent from
    itself (the failure that found this: every guard test of a clone made under /tmp), and showing it
    must not show the rest of /tmp."""
    home, proj, tool = tmp_path / "home", tmp_path / "proj", tmp_path / "tool"
    for d in (home, proj, tool / "pkg"):
        d.mkdir(parents=True)
    (tool / "pkg" / "__init__.py").write_text("WORD = 'from-the-package'\n")
    (tool / "agent.py").write_text("import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\n"
                                   "import pkg\nprint(pkg.WORD)\nprint(open(sys.argv[1]).read())\n")
    other = Path(tempfile.mkdtemp(prefix="fak-not-the-agents-", dir="/tmp"))
    try:
        (other / "secret.txt").write_text("another tmp entry\n")
        argv = [sys.executable, str(tool / "agent.py"), str(other / "secret.txt")]
        runs = {}
        for shown in (True, False):
            spec = contain(proj, home, programs=tuple(argv) if shown else ())
            r = subprocess.run(bwrap_argv(spec, argv, bwrap=find_bwrap() or "bwrap"), capture_output=True, text=True,
                               timeout=60, cwd=proj)
            runs[shown] = r.stdout + r.stderr
        assert "from-the-package" in runs[True]  # the agent and its package beside it
        assert "another tmp entry" not in runs[True] and "No such file" in runs[True]  # the rest stays private
        assert "can't open file" in runs[False]  # the mutation: without its programs, the agent is hidden
    finally:
        shutil.rmtree(other, ignore_errors=True)
