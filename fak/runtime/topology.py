"""The boot of a server whose engine is spread over processes: P/D workers (`--pd`, `--pd-workers`) or
pipeline stages (`--stages`, `--stage-workers`), local, remote or as Ray actors (`--ray`). The model,
tokenizer and options come from fak.runtime.boot's one boot; what differs is where the workers run.
"""

from __future__ import annotations

from typing import Any

from fak.errors import FakError
from fak.runtime.boot import Booted, SchedOptions, boot, eos_ids


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
            cuts: list[int] | None = None) -> Booted:
    """`boot_for_text` for P/D across processes: this process keeps the tokenizer (and a copy of the model
    for embeddings), the engine is a PDHead over `fak worker` processes: `local` decode workers (and one
    prefill worker) started here, or the running workers at `workers` (HOST:PORT each; their roles are
    asked). Transport: shm for local workers, tcp for remote ones, unless given."""
    from engine.errors import EngineError
    from engine.pd.head import PDHead
    from engine.wire.node import probe

    opts = sched or SchedOptions.resolve()
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
                groups = [RayWorkers(stage_specs(plan.bands, f"decode-{j}-"), path, address=ray, resident=resident)
                          for j in range(local)]
            started = RayWorkers(pd_specs(local, opts.as_kwargs(), stage_actors=[g.actors for g in groups] or None),
                                 path, address=ray, resident=resident, resources=ray_resources)
            started.owned = groups
            prefill, decoders = started.addresses[0], started.addresses[1:]
            transport = "tcp"
        elif local:
            from fak.runtime.local import LocalWorkers

            args = [f"--{k.replace('_', '-')}={v}" for k, v in opts.as_kwargs().items() if v is not None]
            started = LocalWorkers(str(b.path) if b.path is not None else model, local, plain=not resident,
                                   sched_args=args)
            prefill, decoders = started.prefill.address, [w.address for w in started.decoders]
        else:
            roles: dict[str, list[str]] = {"prefill": [], "decode": []}
            for url in workers or []:
                try:
                    hello = probe(url)
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
                      down_after=down_after, eos_ids=eos_ids(b.tokenizer, c))
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
                  ray_resources: list[dict[str, float]] | None = None) -> Booted:
    """`boot_for_text` with the layers on pipeline stages: `stages` bands split by bytes (or at `cuts`), run
    by `fak worker --role stage` processes started here (shm), by threads (transport "inproc"), or the
    running stage workers at `workers` (tcp). The scheduler, the embedding and the LM head stay here;
    `micro_batches` groups of lanes (0: one per stage) are in flight at once, one scheduler each."""
    from engine.pipeline.partition import PartitionPlan
    from engine.pipeline.pipeline import local_pipeline, remote_pipeline
    from engine.pipeline.scheduler import PipelinedScheduler

    opts = sched or SchedOptions.resolve()
    b = _boot_head(model, resident, opts)
    started: Any = None
    try:
        if ray is not None:  # Ray places and restarts the stages; hidden rows still move over fak's TCP links
            from fak.runtime.ray import RayWorkers, stage_specs

            plan = PartitionPlan.at(b.model, cuts) if cuts else PartitionPlan.by_bytes(b.model, stages)
            started = RayWorkers(stage_specs(plan.bands), str(b.path) if b.path is not None else model, address=ray,
                                 resident=resident, resources=ray_resources)
            pm = remote_pipeline(b.model, started.addresses, transport="tcp", rejoin=started.rejoin)
            pm.pipeline.owned.append(started)
        elif workers:
            pm = remote_pipeline(b.model, workers, transport=transport or "tcp")
        else:
            plan = PartitionPlan.at(b.model, cuts) if cuts else PartitionPlan.by_bytes(b.model, stages)
            if transport == "inproc":
                pm = local_pipeline(b.model, plan)
            else:
                from fak.runtime.local import LocalStages

                started = LocalStages(str(b.path) if b.path is not None else model, plan.bands, plain=not resident)
                pm = remote_pipeline(b.model, [w.address for w in started.workers], transport=transport or "shm")
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
