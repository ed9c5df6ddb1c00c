"""RayWorkers: fak's workers (pipeline stages, P/D prefill and decode) as Ray actors (`pip install 'fak[ray]'`).

Ray does placement and lifecycle: one actor per worker, placed by a placement group (one CPU bundle per
worker, spread over the nodes) or by explicit per-worker resources, restarted by Ray when it dies
(`max_restarts=-1`). The tensors never go through Ray: each actor hosts the same node a `fak worker`
process hosts (engine/pipeline/stage_node.py, prefill_node.py, decode_node.py) listening on its node's IP,
and the head talks to it over fak's own TCP links (the pattern vLLM's newer Ray executor uses).

A restarted actor comes back with a new address; `rejoin(i)` waits for it and returns it: a pipeline
re-links and recomputes its lanes (engine/pipeline/pipeline.py), a P/D head takes the decode worker back.
Nothing of Ray is imported unless this module is used.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fak.errors import FakError


@dataclass(frozen=True)
class WorkerSpec:
    role: str  # "stage" | "prefill" | "decode"
    name: str
    layers: tuple[int, int] | None = None  # a stage's band
    options: dict[str, Any] = field(default_factory=dict)  # scheduler / prefill keyword arguments


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FakError("Ray is not installed: pip install 'fak[ray]'") from None
    return ray


class _Host:
    """The body of the actor: boot the model, serve one node (Ray wraps this class in ray.remote)."""

    def __init__(self, spec: WorkerSpec, model: str, resident: bool) -> None:
        import ray

        from fak.runtime.boot import boot
        from fak.runtime.nodes import build_node

        b = boot(model, resident=resident, show=False, scheduler=False)
        self._model = b.model
        key = os.environ.get("FAK_PD_KEY", "").encode()  # RayWorkers(env=...): the head's cluster key
        encrypt = os.environ.get("FAK_LINK_ENCRYPT") == "1"
        opts = dict(spec.options)
        b.model.kv_dtype = opts.pop("kv_dtype", b.model.kv_dtype)  # the head's: its frames carry that layout
        stages = opts.pop("stage_actors", None)
        prefill_chunk = opts.pop("prefill_chunk", 64)
        addrs: list[str] | None = None
        if stages:  # a pipelined decode worker: its layers on stage actors, its scheduler and KV pool here
            addrs = [str(a) for a in ray.get([s.address.remote() for s in stages])]
        self.node: Any = build_node(spec.role, b, name=spec.name, host=ray.util.get_node_ip_address(),
                                    layers=spec.layers, prefill_chunk=prefill_chunk, stage_addresses=addrs,
                                    rejoin=(lambda i, why: new_address(stages[i], addrs, i)) if stages else None,
                                    key=key, encrypt=encrypt, **opts)
        self._address = f"{self.node.address[0]}:{self.node.address[1]}"

    def address(self) -> str:
        return self._address

    def health(self) -> dict[str, Any]:
        import ray

        from fak.runtime.nodes import held_layers

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "address": self._address,
                "layers": held_layers(self._model)}  # a stage: only its band


class RayWorkers:
    def __init__(self, specs: list[WorkerSpec], model: str, *, address: str | None = None, resident: bool = True,
                 resources: list[dict[str, float]] | None = None, num_cpus: float = 1.0,
                 ready_timeout: float = 300.0, env: dict[str, str] | None = None) -> None:
        ray = _ray()
        self._started_ray = not ray.is_initialized()  # ours to shut down at close
        if self._started_ray:
            try:
                ray.init(address=None if address in (None, "", "local") else address, log_to_driver=False,
                         include_dashboard=False)
            except Exception as e:  # a wrong address, no cluster: one line
                raise FakError(f"--ray {address}: cannot connect to a Ray cluster ({type(e).__name__}: {e})") from None
        self.ray, self.specs = ray, specs
        cls = ray.remote(max_restarts=-1, max_task_retries=-1)(_Host)
        self.pg = None
        opts: list[dict[str, Any]] = []
        if resources is not None:  # explicit placement (tests: one custom resource per node)
            opts = [{"resources": r, "num_cpus": 0} for r in resources]
        else:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            total = float(ray.cluster_resources().get("CPU", 1.0))
            num_cpus = min(num_cpus, total / len(specs))  # more workers than CPUs (one small host): share them
            self.pg = placement_group([{"CPU": num_cpus}] * len(specs), strategy="SPREAD")
            try:
                ray.get(self.pg.ready(), timeout=ready_timeout)
            except Exception:
                raise FakError(f"Ray could not place {len(specs)} workers of {num_cpus:g} CPU within "
                               f"{ready_timeout:.0f} s (cluster: {ray.cluster_resources()})") from None
            opts = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
                     "num_cpus": num_cpus} for i in range(len(specs))]
        threads = str(max(1, round(num_cpus)))
        # the cluster key rides in the actor's environment, like a `fak worker`'s (never in argv or a task's
        # args); actors listen on their node's IP, so there always is one: the caller's, else a fresh one
        from engine.wire.secure import LinkKey

        env = dict(env or {})
        env.setdefault("FAK_PD_KEY", secrets.token_hex(32))
        self.link = LinkKey.of(env["FAK_PD_KEY"], env.get("FAK_LINK_ENCRYPT") == "1")  # the head's end of the links
        renv = {"env_vars": {"NUMBA_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
                             **env}}
        self.actors = [cls.options(name=None, runtime_env=renv, **o).remote(spec, model, resident)
                       for spec, o in zip(specs, opts, strict=False)]
        try:
            self.addresses = ray.get([a.address.remote() for a in self.actors], timeout=ready_timeout)
        except Exception as e:
            self.close()
            raise FakError(f"Ray workers did not start: {type(e).__name__}: {e}") from None
        self.restarts = [0] * len(specs)
        self._lock = threading.Lock()

    def rejoin(self, i: int, why: str = "", timeout: float = 300.0) -> str:
        """Worker i's address once Ray has restarted it (a new port: a new process)."""
        try:
            addr = new_address(self.actors[i], self.addresses, i, timeout)
        except FakError as e:
            raise FakError(f"{self.specs[i].name}: {e} ({why})") from None
        with self._lock:
            self.restarts[i] += 1
        return addr

    def health(self) -> list[dict[str, Any]]:
        return list(self.ray.get([a.health.remote() for a in self.actors], timeout=30))

    def kill(self, i: int) -> None:
        """Kill worker i's process; Ray restarts it (tests: a stage dying mid-run)."""
        self.ray.kill(self.actors[i], no_restart=False)

    def close(self) -> None:
        """Kill the actors and free the placement group; a Ray runtime this started is shut down. Bounded: a
        cluster that no longer answers does not hold the server's exit."""

        def teardown() -> None:
            if getattr(self, "_started_ray", False):
                self.ray.shutdown()  # takes our actors and placement group with it
                return
            for a in getattr(self, "actors", []):
                try:
                    self.ray.kill(a, no_restart=True)
                except Exception:
                    pass
            if getattr(self, "pg", None) is not None:
                from ray.util.placement_group import remove_placement_group

                try:
                    remove_placement_group(self.pg)
                except Exception:
                    pass

        for g in getattr(self, "owned", []):  # the stage actors of pipelined decode workers
            g.close()
        t = threading.Thread(target=teardown, name="fak-ray-close", daemon=True)
        t.start()
        t.join(15)

def new_address(actor: Any, addresses: list[str], i: int, timeout: float = 300.0) -> str:
    """The address of a restarted actor (its new process listens on a new port); updates addresses[i]."""
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            addr = str(ray.get(actor.address.remote(), timeout=30))
        except Exception:  # still restarting
            time.sleep(0.5)
            continue
        if addr != addresses[i]:
            addresses[i] = addr
            return addr
        time.sleep(0.2)  # the old process has not been noticed dead yet
    raise FakError(f"Ray did not bring the worker back within {timeout:.0f} s")


def supervise_pd(head: Any, workers: RayWorkers, every: float = 0.5) -> threading.Thread:
    """Bring P/D workers back: when the head marks one down, wait for Ray's restart and rejoin it."""

    def loop() -> None:
        while not head._closed:
            for i, spec in enumerate(workers.specs):
                peer = head.prefill if spec.role == "prefill" else head.decoders.get(spec.name)
                if peer is None or peer.up:
                    continue
                try:
                    head.rejoin(spec.name, workers.rejoin(i, "marked down"))
                except Exception:  # tried again on the next round; the head keeps serving without it
                    pass
            time.sleep(every)

    t = threading.Thread(target=loop, name="fak-ray-supervisor", daemon=True)
    t.start()
    return t


def pd_specs(n_decode: int, sched: dict[str, Any], prefill_chunk: int = 64,
             stage_actors: list[list[Any]] | None = None) -> list[WorkerSpec]:
    """One prefill and n decode workers; `stage_actors[j]`: decode worker j's pipeline stages (P/D + stages)."""
    kv = sched.get("kv_dtype") or "f32"  # one type on every worker: the frames between them carry it
    pre = {"block_tokens": sched.get("block_tokens", 16), "prefill_chunk": prefill_chunk, "kv_dtype": kv}
    dec = {k: v for k, v in sched.items() if v is not None} | {"prefill_chunk": prefill_chunk, "kv_dtype": kv}
    return [WorkerSpec("prefill", "prefill-0", options=pre)] + \
           [WorkerSpec("decode", f"decode-{i}", options=dec | ({"stage_actors": stage_actors[i]} if stage_actors else {}))
            for i in range(n_decode)]


def stage_specs(bands: list[tuple[int, int]], prefix: str = "", kv_dtype: str = "f32") -> list[WorkerSpec]:
    return [WorkerSpec("stage", f"{prefix}stage-{i}", layers=b, options={"kv_dtype": kv_dtype})
            for i, b in enumerate(bands)]
