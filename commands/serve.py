"""`fak serve`: the OpenAI-compatible server on the in-kernel engine (fak/gateway), one process."""

from __future__ import annotations

import os
import sys

import typer

from commands import sched_flags
from commands.worker import WORKER_ARGV


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        gguf: str | None = typer.Option(None, "--gguf", help="GGUF path or alias (default $FAK_MODEL or gemma3-270m)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
        port: int = typer.Option(8000, "--port", help="Port (0: the OS picks one)."),
        plain: bool = typer.Option(False, "--plain", help="float32 weights (default: quantized blocks resident)."),
        api_key: str | None = typer.Option(None, "--api-key", help="Require this key (Bearer or X-Api-Key) [FAK_API_KEY]."),
        cors_origin: list[str] = typer.Option([], "--cors-origin", help="Allow this browser origin (repeat)."),
        served_name: str | None = typer.Option(None, "--served-model-name", help="Model name clients use."),
        max_queue: int = typer.Option(256, "--max-queue", help="Waiting requests before 429 (0: unbounded)."),
        max_model_len: int = typer.Option(0, "--max-model-len", help="Context a request may use, prompt + output "
                                          "(0: the model's)."),
        max_running: int | None = sched_flags.MAX_RUNNING,
        kv_blocks: int | None = sched_flags.KV_BLOCKS,
        block_tokens: int | None = sched_flags.BLOCK_TOKENS,
        preempt: str | None = sched_flags.PREEMPT,
        victim: str | None = sched_flags.VICTIM,
        prefix_cache_gib: float | None = sched_flags.PREFIX_CACHE_GIB,
        kv_cache_dir: str | None = sched_flags.KV_CACHE_DIR,
        no_kv_cache_dir: bool = sched_flags.NO_KV_CACHE_DIR,
        kv_cache_disk_gib: float | None = sched_flags.KV_CACHE_DISK_GIB,
        kv_dtype: str | None = sched_flags.KV_DTYPE,
        speculative: str | None = sched_flags.SPECULATIVE,
        spec_tokens: int | None = sched_flags.SPEC_TOKENS,
        live: bool = typer.Option(False, "--live", help="A live view of the engine in this terminal (stderr)."),
        json_logs: bool = typer.Option(False, "--json-logs", help="Log one JSON object per line (with an access log)."),
        policy: str | None = typer.Option(None, "--policy", help="Policy JSON for the tool calls the model proposes "
                                             "(default: the coding floor, offered tools known)."),
        journal: str | None = typer.Option(None, "--journal", help="Append every decision to this hash-chained JSONL."),
        pd: str | None = typer.Option(None, "--pd", help="Prefill/decode disaggregation on this host: P:D worker "
                                         "processes, e.g. 1:2 (shm transport, cores split between them)."),
        pd_workers: str | None = typer.Option(None, "--pd-workers", help="Use running `fak worker` processes: "
                                                 "HOST:PORT,... (one prefill, any decode; tcp transport)."),
        pd_transport: str | None = typer.Option(None, "--pd-transport", help="P/D KV transport: shm | tcp "
                                                   "(default shm with --pd, tcp with --pd-workers)."),
        stages: int = typer.Option(0, "--stages", help="Pipeline the layers over N local stage processes (split by "
                                   "weight bytes; the scheduler, embedding and head stay here)."),
        cuts: str | None = typer.Option(None, "--cuts", help="Explicit pipeline cut points, e.g. 9,18 (with "
                                           "--stages, or instead of it)."),
        stage_workers: str | None = typer.Option(None, "--stage-workers", help="Use running `fak worker --role "
                                                    "stage` processes: HOST:PORT,... in layer order (tcp)."),
        stage_transport: str | None = typer.Option(None, "--stage-transport", help="Stage links: inproc | shm | "
                                                      "tcp (default shm for --stages, tcp for --stage-workers)."),
        ray: str | None = typer.Option(None, "--ray", help="Run the --stages / --pd workers as Ray actors: auto "
                                          "(the running cluster), HOST:PORT, or local (start Ray here); fak[ray]."),
        micro_batches: int = typer.Option(0, "--micro-batches", help="Pipeline: groups of lanes in flight at once, "
                                          "one scheduler each (0: one per stage)."),
        cluster_key: str | None = sched_flags.KEY,
        link_encrypt: bool = sched_flags.LINK_ENCRYPT,
        no_console: bool = typer.Option(False, "--no-console", help="No web console at / (chat, engine, decisions, "
                                        "policy tester)."),
    ) -> None:
        """Serve the model over HTTP: OpenAI chat/completions, /v1/models, /tokenize, /health, /metrics."""
        from fak.errors import FakError
        from fak.gateway import logs
        from fak.runtime.boot import SchedOptions, boot_for_text
        from fak.runtime.topology import pd_flags, stage_flags

        logs.setup(json_logs)

        if not 0 <= port <= 65535:
            raise FakError(f"--port {port}: expected 0..65535")
        if max_model_len < 0:
            raise FakError(f"--max-model-len {max_model_len}: expected a non-negative integer")
        if max_queue < 0:
            raise FakError(f"--max-queue {max_queue}: expected a non-negative integer")
        sched = SchedOptions.resolve(max_running=max_running, kv_blocks=kv_blocks, block_tokens=block_tokens,
                                     preempt=preempt, victim=victim,
                                     **sched_flags.cache_flags(prefix_cache_gib, kv_cache_dir, no_kv_cache_dir,
                                                               kv_cache_disk_gib, kv_dtype),
                                     **sched_flags.spec_flags(speculative, spec_tokens))
        from engine.gguf.aliases import default_model, resolve_model

        name = gguf or default_model()
        if name != "synthetic":
            resolve_model(name)  # a bad model is one line before anything listens
        key = api_key or os.environ.get("FAK_API_KEY") or None
        if host not in ("127.0.0.1", "localhost", "::1") and not key:
            logs.SERVER.warning(f"fak serve: warning: listening on {host} without an API key (--api-key)")
        served = served_name or os.path.basename(name)
        local, workers = pd_flags(pd, pd_workers, pd_transport)
        pipe = stage_flags(stages, cuts, stage_workers, stage_transport, micro_batches,
                            bool(local or workers) and ray is None)
        pd_pipe = pipe if (pipe is not None and local) else None  # --ray --pd 1:N --stages S: pipelined decoders
        if pd_pipe is not None:
            pipe = None
        if ray is not None:
            if workers or stage_workers:
                raise FakError("--ray places workers itself: drop --pd-workers / --stage-workers")
            if not (local or pipe):
                raise FakError("--ray needs --stages N (pipeline stages) or --pd 1:N (P/D workers) to place")
            if pd_pipe is not None and pd_pipe.get("micro_batches"):
                raise FakError("--micro-batches with --pd: a pipelined decode worker runs one group")
            if (pd_transport or stage_transport or "tcp") != "tcp":
                raise FakError("--ray: workers on other nodes talk over tcp (drop --pd-transport / --stage-transport)")
            from fak.runtime.ray import _ray

            _ray()  # not installed: one line now, before anything listens
            if ray not in ("local",) and os.environ.get("RAY_AUTH_MODE") != "token":
                logs.SERVER.warning("fak serve: warning: --ray without Ray's token authentication (RAY_AUTH_MODE=token "
                                    "and RAY_AUTH_TOKEN_PATH on every node and here): whoever reaches the cluster's "
                                    "ports can run code on it")
            if pipe is not None:
                pipe["ray"] = ray
        link = sched_flags.link_flags(cluster_key, link_encrypt)
        kernel = _kernel(policy, journal)

        def _boot() -> object:
            if pipe is not None:
                from fak.runtime.topology import boot_pipeline

                b = boot_pipeline(name, resident=not plain, sched=sched, worker_argv=WORKER_ARGV, **pipe, **link)
                logs.SERVER.info(b.boot_line(), extra={"model": name})
                p = b.scheduler.model.pipeline  # type: ignore[attr-defined]
                bands = [f"{s['layers'][0]}:{s['layers'][1]}" for s in p.stage_stats()]
                logs.SERVER.info(f"pipeline over {p.transport}: {len(bands)} stages, layers {' '.join(bands)}, "
                                 f"{len(b.scheduler.groups)} groups of lanes in flight")  # type: ignore[attr-defined]
                return b
            if local or workers:
                from fak.runtime.topology import boot_pd

                b = boot_pd(name, resident=not plain, sched=sched, local=local, workers=workers, worker_argv=WORKER_ARGV,
                            transport=pd_transport, ray=ray, stages=int((pd_pipe or {}).get("stages") or 0),
                            cuts=(pd_pipe or {}).get("cuts"), **link)  # type: ignore[arg-type]
                logs.SERVER.info(b.boot_line(), extra={"model": name})
                h = b.scheduler  # type: ignore[attr-defined]
                logs.SERVER.info(f"P/D over {h.transport}: prefill {h.prefill.address} · decode "
                                 + ", ".join(p.address for p in h.decoders.values()))
                return b
            b = boot_for_text(name, "fak serve", resident=not plain, sched=sched)
            logs.SERVER.info(b.boot_line(), extra={"model": name})
            return b

        if live and not sys.stderr.isatty():
            logs.SERVER.warning("fak serve: warning: --live needs a terminal on stderr; running without it")
            live = False
        from fak.gateway.server import run_server

        run_server(_boot, served, host, port, key, cors_origin, max_queue, live, kernel, max_model_len,
                   console=not no_console)


def _kernel(policy: str | None, journal: str | None) -> object:
    """The kernel that adjudicates the model's tool calls (bad files are one line before listening)."""
    from fak.core.journal import Journal
    from fak.core.kernel import Kernel
    from fak.core.policy import load_policy, serving_floor

    k = Kernel.with_policy(load_policy(policy) if policy else serving_floor())
    if journal:
        k.journal = Journal(journal)
    return k
