"""`fak q4kdiag`: what resident quantized weights cost and how fast the kernels stream them."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

import typer

DEFAULT_PROMPT = "The capital of France is"


def register(app: typer.Typer) -> None:
    @app.command("q4kdiag")
    def q4kdiag(
        gguf: str | None = typer.Option(None, "--gguf", help="GGUF path or alias (default $FAK_MODEL or gemma3-270m)."),
        prompt: str = typer.Option(DEFAULT_PROMPT, "--prompt", help="Prompt for the first-token top-K logits."),
        top: int = typer.Option(5, "--top", help="How many top logits to show."),
        membw: float | None = typer.Option(None, "--membw", help="Memory bandwidth in GB/s (default: measure it)."),
        plan_only: bool = typer.Option(False, "--plan-only", help="Read only the header: the memory plan."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        all_types: bool = typer.Option(False, "--all-types", help="Also check the kernel of every resident type "
                                       "the file does not hold, on a synthetic weight."),
    ) -> None:
        """Resident-weight diagnostics: memory plan, kernel error and GB/s, bandwidth ceiling, top-K logits."""
        from fak.errors import FakError

        if top < 1:
            raise FakError(f"q4kdiag: --top must be >= 1, got {top}")
        if membw is not None and not (math.isfinite(membw) and membw > 0):  # nan would also break the JSON
            raise FakError(f"q4kdiag: --membw must be > 0 GB/s and finite, got {membw}")
        try:  # argv bytes that are not UTF-8 arrive as lone surrogates the tokenizer cannot take
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FakError(f"q4kdiag: --prompt is not valid UTF-8 (at character {exc.start})") from None
        report = diagnose(gguf, prompt, top, membw, plan_only, show=False if as_json else None, all_types=all_types)
        if as_json:
            sys.stdout.write(json.dumps(report) + "\n")
        else:
            render(report)


def diagnose(gguf: str | None, prompt: str, top: int, membw: float | None, plan_only: bool,
             show: bool | None = None, all_types: bool = False) -> dict[str, Any]:
    from engine.gguf.aliases import resolve_model
    from engine.model.diag import (
        kernel_checks,
        open_gguf,
        plan,
        rss_bytes,
        stream_read_gbps,
        synthetic_kernel_checks,
        top_logits,
    )

    path = resolve_model(gguf)
    g = open_gguf(path)
    p = plan(g)
    report: dict[str, Any] = {
        "model": p.model, "arch": p.arch, "path": str(path), "tensor_types": p.tensor_types,
        "file_bytes": p.file_bytes, "resident_bytes": p.resident_bytes, "rss_bytes": None, "kernels": [],
        "membw_gbps": membw, "prompt_ids": [], "top": [],
        # extras for the rendering: the float32 plan, bytes one decode step reads
        "f32_plan_bytes": p.f32_bytes, "bytes_per_token": p.bytes_per_token,
        "type_bytes": {t.type: t.resident_bytes for t in p.types},
    }
    if plan_only:
        report["rss_bytes"] = rss_bytes()
        return report
    from fak.runtime.boot import boot

    b = boot(str(path), resident=True, scheduler=False, show=show)  # the kernels run on this thread
    tok = b.tokenizer
    ids = tok.encode(prompt) if tok is not None else list(prompt.encode("utf-8"))
    if not ids:
        from fak.errors import FakError

        raise FakError("q4kdiag: --prompt encodes to no tokens")
    report["prompt_ids"] = [int(i) for i in ids]
    report["top"] = [{"id": i, "logit": lg, "text": _text(tok, i)} for i, lg in top_logits(b.model, ids, top)]
    checks = kernel_checks(g)
    if all_types:  # the resident types the file does not hold, on synthetic weights
        checks += synthetic_kernel_checks({k.type for k in checks})
    report["kernels"] = [dataclasses.asdict(k) for k in checks]  # type, tensor, max_abs_err, gbps
    report["rss_bytes"] = rss_bytes()  # before the bandwidth probe allocates its buffer
    if membw is None:
        report["membw_gbps"] = stream_read_gbps()
    return report


def _text(tok: Any, i: int) -> str:
    if tok is None:
        return ""
    try:
        return str(tok.token_text(i))
    except Exception:  # noqa: BLE001 - a display nicety; the id is what matters
        return tok.decode([i])


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def render(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.print(f"[bold]{r['model']}[/] ({r['arch']})  {r['path']}")
    mem = Table(title="memory", show_edge=False)
    for col in ("type", "tensors", "resident", "float32 plan"):
        mem.add_column(col, justify="right" if col != "type" else "left")
    for t, n in r["tensor_types"].items():
        mem.add_row(t, str(n), _mib(r["type_bytes"][t]), "")
    mem.add_row("[bold]total", str(sum(r["tensor_types"].values())), _mib(r["resident_bytes"]), _mib(r["f32_plan_bytes"]))
    con.print(mem)
    con.print(f"file {_mib(r['file_bytes'])}   resident {_mib(r['resident_bytes'])}   "
              f"float32 plan {_mib(r['f32_plan_bytes'])}   process RSS {_mib(r['rss_bytes'])}")
    bw = r["membw_gbps"]
    if r["kernels"]:
        kt = Table(title="kernels (1-row GEMV on the largest tensor of each type, or a synthetic one)", show_edge=False)
        for col in ("type", "tensor", "max abs err", "GB/s", "of ceiling"):
            kt.add_column(col, justify="left" if col in ("type", "tensor") else "right")
        for k in r["kernels"]:
            frac = f"{k['gbps'] / bw:.0%}" if bw else "-"
            kt.add_row(k["type"], k["tensor"], f"{k['max_abs_err']:.2e}", f"{k['gbps']:.2f}", frac)
        con.print(kt)
    if bw:
        ceiling = bw * 1e9 / r["bytes_per_token"]
        con.print(f"memory bandwidth {bw:.2f} GB/s; a decode step reads {_mib(r['bytes_per_token'])} "
                  f"-> decode ceiling {ceiling:.1f} tok/s")
    if r["top"]:
        con.print(f"prompt ids {r['prompt_ids']}")
        tt = Table(title=f"first-token top {len(r['top'])}", show_edge=False)
        for col in ("rank", "id", "logit", "text"):
            tt.add_column(col, justify="right" if col != "text" else "left")
        for n, t in enumerate(r["top"], 1):
            tt.add_row(str(n), str(t["id"]), f"{t['logit']:.3f}", repr(t["text"]))
        con.print(tt)
