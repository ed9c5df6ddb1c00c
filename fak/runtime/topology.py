"""A serving topology from its flags (pd_flags, stage_flags, parse_pd) and its boot when the engine is spread over
processes: P/D workers (`--pd`, `--pd-workers`) or
pipeline stages (`--stages`, `--stage-workers`), local, remote or as Ray actors (`--ray`). The model,
tokenizer and options come from fak.runtime.boot's one boot; what differs is where the workers run.
"""

from __future__ import annotations

from typing import Any

from fak.errors import FakError
from fak.runtime.boot import Booted, SchedOptions, boot, eos_ids


# -- the flag rules: bad combinations are one line before anything starts
def parse_pd(text: str) -> tuple[int, int]:
    """'1:2' -> (1 prefill, 2 decode); one line of error otherwise."""
    p, sep, d = text.partition(":")
    if not sep or not p.strip().isdigit() or not d.strip().isdigit():
        raise FakError(f"--pd {text!r}: expected PREFILL:DECODE worker counts, e.g. 1:2")
    n_p, n_d = int(p), int(d)
    if n_p != 1:
        raise FakError(f"--pd {text!r}: one prefill worker is supported (got {n_p})")
    if not 1 <= n_d <= 16:
        raise FakError(f"--pd {text!r}: expected 1..16 decode workers (got {n_d})")
    return n_p, n_d


def pd_flags(pd: str | None, pd_workers: str | None, transport: str | None) -> tuple[int, list[str]]:
    """(local decode workers to start, remote worker addresses); bad combinations are one line."""
    from engine.wire.channel import parse_address

    if pd and pd_workers:
        raise FakError("--pd and --pd-workers: give one (local workers, or running ones)")
    if transport is not None and transport not in ("shm", "tcp"):
        raise FakError(f"--pd-transport {transport!r}: expected shm or tcp")
    if transport is not None and not (pd or pd_workers):
        raise FakError("--pd-transport needs --pd or --pd-workers")
    if pd:
        return parse_pd(pd)[1], []
    if pd_workers:
        urls = [u.strip() for u in pd_workers.split(",") if u.strip()]
        for u in urls:
            try:
                parse_address(u, "--pd-workers entry")
            except ValueError as e:
                raise FakError(str(e)) from None
        if len(urls) < 2:
            raise FakError("--pd-workers: need a prefill and at least one decode worker (HOST:PORT,HOST:PORT,...)")
        return 0, urls
    return 0, []


def stage_flags(stages: int, cuts: str | None, workers: str | None, transport: str | None, micro_batches: int,
                 pd: bool) -> dict[str, object] | None:
    """boot_pipeline's arguments, or None without pipeline flags; bad combinations are one line."""
    from engine.errors import EngineError
    from engine.pipeline.partition import PartitionPlan
    from engine.wire.channel import parse_address

    if not (stages or cuts or workers):
        if transport is not None or micro_batches:
            raise FakError("--stage-transport / --micro-batches need --stages, --cuts or --stage-workers")
        return None
    if pd:
        raise FakError("--stages with --pd: pipelined decode workers need --ray (they run as Ray actors)")
    if stages < 0 or micro_batches < 0:
        raise FakError("--stages / --micro-batches: expected a non-negative integer")
    if transport is not None and transport not in ("inproc", "shm", "tcp"):
        raise FakError(f"--stage-transport {transport!r}: expected inproc, shm or tcp")
    if workers and (stages or cuts):
        raise FakError("--stage-workers: the workers' --layers say where the cuts are (drop --stages / --cuts)")
    if workers:
        if transport == "inproc":
            raise FakError("--stage-workers run in other processes: --stage-transport tcp or shm")
        urls = [u.strip() for u in workers.split(",") if u.strip()]
        for u in urls:
            try:
                parse_address(u, "--stage-workers entry")
            except ValueError as e:
                raise FakError(str(e)) from None
        return {"workers": urls, "transport": transport, "micro_batches": micro_batches}
    try:
        cut_list = PartitionPlan.parse_cuts(cuts) if cuts else None
    except EngineError as e:
        raise FakError(str(e)) from None
    if cut_list is not None and stages and len(cut_list) != stages - 1:
        raise FakError(f"--cuts {cuts} makes {len(cut_list) + 1} stages, --stages says {stages}")
    return {"stages": stages or (len(cut_list) + 1 if cut_list else 0), "cuts": cut_list, "transport": transport,
            "micro_batches": micro_batches}


def _argv(worker_argv: list[str] | None) -> list[str]:
    """The command that runs `fak worker` here, as the caller (commands/serve.py) gave it."""
    if not worker_argv:
        raise FakError("local workers need the command that starts `fak worker` (worker_argv)")
    return worker_argv


def cluster_key(key: bytes, own_workers: bool) -> bytes:
    """The key the links are sealed with: the user's, or for workers this process starts itself (local or Ray)
    a fresh random one, so even loopback links are authenticated and no other process can join them."""
    if key or not own_workers:
        return key
    import secrets

    return secrets.token_hex(32).encode()


def link_env(key: bytes, encrypt: bool) -> dict[str, str]:
    """How a worker this process starts learns the key: its environment (argv is visible to every user)."""
    return {"FAK_PD_KEY": key.decode(), **({"FAK_LINK_ENCRYPT": "1"} if encrypt else {})} if key else {}


def _boot_head(model: str, resident: bool, opts: SchedOptions) -> Booted:
    """The serving process's model and tokenizer, no scheduler of its own (its workers run the engine)."""
    b = boot(model, resident=resident, sched=opts, show=False, scheduler=False)
    if b.tokenizer is None or b.tokenizer.vocab_size < b.model.config.vocab_size:
        raise FakError(f"{model}: no tokenizer for text: fak serve needs one")
    return b


def _close_on_error(started: Any, e: BaseException) -> None:
    """A boot that failed after starting workers stops them; an engine error becomes the one-line FakError."""
    from engine.errors import EngineError

    if started is not None:
        started.close()
    if isinstance(e, EngineError):
        raise FakError(str(e)) from None
    raise e


def boot_pd(model: str, *, resident: bool = True, sched: SchedOptions | None = None, local: int = 0,
            workers: list[str] | None = None, transport: str | None = None, down_after: float = 5.0,
            ray: str | None = None, ray_resources: list[dict[str, float]] | None = None, stages: int = 0,
            cuts: list[int] | None = None, worker_argv: list[str] | None = None, key: bytes = b"",
            encrypt: bool = False) -> Booted:
    """`boot_for_text` for P/D across processes: this process keeps the tokenizer (and a copy of the model
    for embeddings), the engine is a PDHead over `fak worker` processes: `local` decode workers (and one
    prefill worker) started here, or the running workers at `workers` (HOST:PORT each; their roles are
    asked). Transport: shm for local workers, tcp for remote ones, unless given. `key`: the cluster key
    (workers started here get a random one when none is given), `encrypt`: links encrypted too."""
    from engine.errors import EngineError
    from engine.pd.head import PDHead
    from engine.wire.node import probe
    from engine.wire.secure import LinkKey

    opts = sched or SchedOptions.resolve()
    key = cluster_key(key, bool(local or ray is not None))
    link = LinkKey.of(key, encrypt)
    b = _boot_head(model, resident, opts)
    started: Any = None
    try:
        if ray is not None:  # Ray places and restarts the workers; KV still moves over fak's TCP links
            from engine.pipeline.partition import PartitionPlan
            from fak.runtime.ray import RayWorkers, pd_specs, stage_specs

            path = str(b.path) if b.path is not None else model
            groups: list[Any] = []
            if stages or cuts:  # each decode worker pipelined over its own stage actors
                plan = PartitionPlan.at(b.model, cuts) if cuts else PartitionPlan.by_bytes(b.model, stages)
                groups = [RayWorkers(stage_specs(plan.bands, f"decode-{j}-", opts.kv_dtype), path, address=ray,
                                     resident=resident, env=link_env(key, encrypt))
                          for j in range(local)]
            specs = pd_specs(local, opts.as_kwargs() | {"kv_dtype": opts.kv_dtype},
                             stage_actors=[g.actors for g in groups] or None)
            started = RayWorkers(specs, path, address=ray, resident=resident, resources=ray_resources,
                                 env=link_env(key, encrypt))
            started.owned = groups
            prefill, decoders = started.addresses[0], started.addresses[1:]
            transport = "tcp"
        elif local:
            from fak.runtime.local import LocalWorkers

            args = opts.worker_args()
            started = LocalWorkers(str(b.path) if b.path is not None else model, local, plain=not resident,
                                   sched_args=args, worker_argv=_argv(worker_argv), env=link_env(key, encrypt))
            prefill, decoders = started.prefill.address, [w.address for w in started.decoders]
        else:
            roles: dict[str, list[str]] = {"prefill": [], "decode": []}
            for url in workers or []:
                try:
                    hello = probe(url, key=link)
                except (EngineError, ValueError) as e:
                    raise FakError(f"--pd-workers {url}: {e}") from None
                roles.setdefault(str(hello.get("role")), []).append(url)
            if len(roles["prefill"]) != 1 or not roles["decode"]:
                raise FakError(f"--pd-workers: need exactly one prefill and at least one decode worker, got "
                               f"{len(roles['prefill'])} prefill and {len(roles['decode'])} decode")
            prefill, decoders = roles["prefill"][0], roles["decode"]
        c = b.model.config
        head = PDHead(prefill, decoders, tokenizer=b.tokenizer, identity=b.model.identity,
                      vocab_size=int(c.vocab_size), context_length=int(getattr(c, "context_length", 0) or 0),
                      block_tokens=opts.block_tokens, transport=transport or ("shm" if local else "tcp"),
                      down_after=down_after, eos_ids=eos_ids(b.tokenizer, c), link=link)
    except BaseException as e:
        _close_on_error(started, e)
    if started is not None:
        head.owned.append(started)
        head.local = started  # type: ignore[attr-defined]
        if ray is not None:
            from fak.runtime.ray import supervise_pd

            supervise_pd(head, started)
    b.scheduler = head
    return b


def boot_pipeline(model: str, *, resident: bool = True, sched: SchedOptions | None = None, stages: int = 0,
                  cuts: list[int] | None = None, workers: list[str] | None = None, transport: str | None = None,
                  micro_batches: int = 0, ray: str | None = None,
                  ray_resources: list[dict[str, float]] | None = None, worker_argv: list[str] | None = None,
                  key: bytes = b"", encrypt: bool = False) -> Booted:
    """`boot_for_text` with the layers on pipeline stages: `stages` bands split by bytes (or at `cuts`), run
    by `fak worker --role stage` processes started here (shm), by threads (transport "inproc"), or the
    running stage workers at `workers` (tcp). The scheduler, the embedding and the LM head stay here;
    `micro_batches` groups of lanes (0: one per stage) are in flight at once, one scheduler each."""
    from engine.pipeline.partition import PartitionPlan
    from engine.pipeline.pipeline import local_pipeline, rejoin_in_place, remote_pipeline
    from engine.pipeline.scheduler import PipelinedScheduler
    from engine.wire.secure import LinkKey

    opts = sched or SchedOptions.resolve()
    key = cluster_key(key, not workers and transport != "inproc")
    link = LinkKey.of(key, encrypt)
    b = _boot_head(model, resident, opts)
    started: Any = None
    try:
        if ray is not None:  # Ray places and restarts the stages; hidden rows still move over fak's TCP links
            from fak.runtime.ray import RayWorkers, stage_specs

            plan = PartitionPlan.at(b.model, cuts) if cuts else PartitionPlan.by_bytes(b.model, stages)
            path = str(b.path) if b.path is not None else model
            started = RayWorkers(stage_specs(plan.bands, kv_dtype=opts.kv_dtype), path, address=ray, resident=resident,
                                 resources=ray_resources, env=link_env(key, encrypt))
            pm = remote_pipeline(b.model, started.addresses, transport="tcp", rejoin=started.rejoin, link=link)
            pm.pipeline.owned.append(started)
        elif workers:
            pm = remote_pipeline(b.model, workers, transport=transport or "tcp", link=link,
                                 rejoin=rejoin_in_place(workers, link))  # a stage that comes back is taken back
        else:
            plan = PartitionPlan.at(b.model, cuts) if cuts else PartitionPlan.by_bytes(b.model, stages)
            if transport == "inproc":
                pm = local_pipeline(b.model, plan)
            else:
                from fak.runtime.local import LocalStages

                started = LocalStages(str(b.path) if b.path is not None else model, plan.bands, plain=not resident,
                                      worker_argv=_argv(worker_argv),
                                      env={"FAK_KV_DTYPE": opts.kv_dtype, **link_env(key, encrypt)})
                pm = remote_pipeline(b.model, [w.address for w in started.workers], transport=transport or "shm",
                                     link=link)
                pm.pipeline.owned.append(started)
        eos = eos_ids(b.tokenizer, b.model.config)
        # one scheduler per group of lanes in flight (default: one per stage, so every stage has a step to run)
        s = PipelinedScheduler(pm, micro_batches, tokenizer=b.tokenizer, eos_ids=eos, warm=True, **opts.as_kwargs())
        s.wait_warm()
    except BaseException as e:
        _close_on_error(started, e)
    b.scheduler = s
    b.owned.append(pm)
    return b
