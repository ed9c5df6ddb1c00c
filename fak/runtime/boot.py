"""One boot for every model-using subcommand: model, tokenizer, scheduler, warm kernels, one boot line.

    b = boot("gemma3-270m", sched=SchedOptions.resolve(max_running=4))   # resident by default
    h = b.scheduler.admit(Request(b.tokenizer.encode("Hi"), max_new_tokens=8))
    b.close()

The model is a GGUF path, an alias (`gemma3-270m`) or `synthetic`; None means $FAK_MODEL, else the
packaged Gemma. Scheduler options come from flags, else their FAK_* variables, else defaults; a bad
one is a FakError line (exit 2) at boot, never an error on every request.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fak.errors import FakError

if TYPE_CHECKING:
    from fak.runtime.compile_progress import CompileProgress


@dataclass(frozen=True)
class SchedOptions:
    """The scheduler flags every model-using subcommand shares (`--max-running` ... `--victim`), and the
    prefix cache's sizes: memory (`--prefix-cache-gib`) and the disk tier (`--kv-cache-dir`, `--kv-cache-disk-gib`)."""

    max_running: int = 0  # 0: unbounded
    kv_blocks: int | None = None  # None: the pool grows
    block_tokens: int = 16
    preempt: str = "swap"
    victim: str = "most-recent"
    prefix_cache_gib: float | None = None  # None: a quarter of the machine's memory
    kv_cache_dir: str | None = None  # None: ~/.cache/fak/kv/<model identity>; "off": no disk tier
    kv_cache_disk_gib: float | None = None  # None: 20 GiB or a quarter of the free disk, the smaller
    # what the KV cache stores: f32 | f16 | bf16 (engine/kernels/kvtype.py). f16, as llama.cpp: at 16k positions
    # decode runs 1.5-1.8x f32's (K/V are half the bytes; bench/longctx.py) and a context takes half the memory,
    # for logits within 1e-2..4e-2 of f32's and no greedy token moved (bench/kv_dtype.py, test_oracle_gemma);
    # --kv-dtype f32 keeps HF's logits to 1e-4
    kv_dtype: str = "f16"
    # speculative decoding (engine/sched/draft.py): off | ngram | suffix, and the longest draft a lane may earn
    speculative: str = "off"
    spec_tokens: int = 8

    ENV = {"max_running": "FAK_MAX_RUNNING", "kv_blocks": "FAK_KV_BLOCKS", "block_tokens": "FAK_BLOCK_TOKENS",
           "preempt": "FAK_PREEMPT", "victim": "FAK_VICTIM", "prefix_cache_gib": "FAK_PREFIX_CACHE_GIB",
           "kv_cache_dir": "FAK_KV_CACHE_DIR", "kv_cache_disk_gib": "FAK_KV_CACHE_DISK_GIB", "kv_dtype": "FAK_KV_DTYPE",
           "speculative": "FAK_SPECULATIVE", "spec_tokens": "FAK_SPEC_TOKENS"}
    _SCHED = ("max_running", "kv_blocks", "block_tokens", "preempt", "victim")  # what every worker takes too

    @classmethod
    def resolve(cls, *, env: bool = True, **given: Any) -> SchedOptions:
        """Flag value, else (with `env`) its FAK_* variable, else the default; checked here, once."""
        from engine.kernels.kvtype import KV_DTYPES
        from engine.sched.draft import SPECULATIVE_MODES
        from engine.sched.preemption import PREEMPT_MODES, VICTIM_RULES

        choices = {"preempt": PREEMPT_MODES, "victim": VICTIM_RULES, "kv_dtype": KV_DTYPES,
                   "speculative": SPECULATIVE_MODES}
        floats = ("prefix_cache_gib", "kv_cache_disk_gib")
        out: dict[str, Any] = {}
        for key, var in cls.ENV.items():
            val, label = given.get(key), f"--{key.replace('_', '-')} {{}}"
            raw = os.environ.get(var, "").strip() if env else ""
            if val is None and raw:
                label = f"{key} {{}} (or ${var})"
                try:
                    val = raw if key in choices or key == "kv_cache_dir" else float(raw) if key in floats else int(raw)
                except ValueError:
                    raise FakError(f"{var}={raw!r} is not a valid {'number' if key in floats else 'int'}") from None
            if val is None:
                continue
            if key in choices:
                if val not in choices[key]:
                    raise FakError(f"{label.format(repr(val))}: expected one of {', '.join(choices[key])}")
            elif key == "kv_cache_dir":
                val = str(val)
                if not val.strip():
                    raise FakError(f"{label.format(repr(val))}: expected a directory (or off)")
            elif key in floats:
                if not isinstance(val, (int, float)) or not 0 <= float(val) < 1 << 20:
                    raise FakError(f"{label.format(val)}: expected a non-negative number of GiB")
                val = float(val)
            elif not isinstance(val, int) or val < (0 if key == "max_running" else 1):
                raise FakError(f"{label.format(val)}: expected a "
                               f"{'non-negative' if key == 'max_running' else 'positive'} integer")
            out[key] = val
        return cls(**out)

    def as_kwargs(self) -> dict[str, Any]:
        """The scheduler flags (what a worker process takes too)."""
        return {k: getattr(self, k) for k in self._SCHED}

    def worker_args(self) -> list[str]:
        """The flags a worker process is started with: the scheduler's and the KV dtype (its pools must hold
        what the head's frames carry)."""
        return [f"--{k.replace('_', '-')}={v}" for k, v in self.as_kwargs().items() if v is not None] + \
            [f"--kv-dtype={self.kv_dtype}"]

    def cache_kwargs(self, model: Any) -> dict[str, Any]:
        """The head scheduler's prefix-cache sizes and its disk tier for `model` (NativeScheduler kwargs)."""
        out: dict[str, Any] = {}
        if self.prefix_cache_gib is not None:
            out["prefix_cache_bytes"] = int(self.prefix_cache_gib * 2**30)
        if self.kv_cache_dir != "off" and self.kv_cache_disk_gib != 0:
            from engine.kernels.kvtype import WIRE
            from engine.wire.frame import KVLayout
            from engine.wire.kv_disk import KVDiskCache, default_bound, model_dir

            # the scheduler's pool layout, stated here (allocating a pool to read it would fail on an absurd
            # --block-tokens before the scheduler can say so); NativeScheduler drops a disk that does not fit
            c = model.config
            layout = KVLayout(c.n_layers, c.n_kv_heads, c.head_dim, self.block_tokens, WIRE[self.kv_dtype])
            root = model_dir(model.identity, self.kv_cache_dir)
            bound = int(self.kv_cache_disk_gib * 2**30) if self.kv_cache_disk_gib is not None else default_bound(root)
            out["kv_disk"] = KVDiskCache(root, model.identity, layout, bound)
        return out


@dataclass
class Booted:
    """What a boot built. `tokenizer` may be None only for a GGUF without a vocabulary (ids in, ids out)."""

    name: str  # as the user gave it (alias, path or "synthetic")
    path: Path | None
    model: Any  # engine.model.forward.Model
    tokenizer: Any
    scheduler: Any  # engine.sched.scheduler.NativeScheduler; None for boot(scheduler=False)
    resident: bool
    load_s: float
    warm_s: float
    owned: list[Any] = field(default_factory=list)  # closed after the scheduler (a pipeline's stages)

    @property
    def text_ok(self) -> bool:
        """The scheduler streams text: the tokenizer spells every id the model can produce."""
        return self.scheduler is not None and self.scheduler.tokenizer is not None

    def boot_line(self) -> str:
        c = self.model.config
        mix = " ".join(f"{t}:{n}" for t, n in sorted(self.model.tensor_types.items(), key=lambda kv: -kv[1]))
        kind = "resident" if self.resident else "float32"
        layers = f"{c.n_layers} layer{'s' if c.n_layers != 1 else ''}"
        return (f"fak: {self.name} · {c.arch} · {layers} · {mix or 'synthetic'} · "
                f"{kind} {self.model.weights.nbytes / 2**20:,.1f} MiB · loaded in {self.load_s:.2f} s · "
                f"kernels warmed in {self.warm_s:.2f} s")

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        for thing in self.owned:
            thing.close()


def cold_kernels(root: Path | None = None) -> Path | None:
    """Where numba caches the kernels of `root` (default: the engine package) when the next run will compile
    some: nothing cached at all (the first run), or a module whose cached kernels are all older than its
    source (an update). About a minute on 2 cores. A module with no index is not a sign by itself: inline
    helpers and kernels of paths not taken yet are never cached on their own."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None  # relocated: numba's own layout there, not checked
    if root is None:
        import engine

        root = Path(engine.__file__).parent
    first: Path | None = None
    any_index = False
    for src in sorted(root.rglob("*.py")):
        try:
            if "cache=True" not in src.read_text(encoding="utf-8"):
                continue
            cache = src.parent / "__pycache__"
            first = first or cache
            index = list(cache.glob(f"{src.stem}.*.nbi"))
            any_index = any_index or bool(index)
            if index and all(p.stat().st_mtime < src.stat().st_mtime for p in index):
                return cache
        except OSError:
            continue
    return None if any_index else first


def boot(model: str | None = None, *, resident: bool = True, sched: SchedOptions | None = None,
         show: bool | None = None, bytes_fallback: bool = False, scheduler: bool = True) -> Booted:
    """Load the model (plain or resident), install its tokenizer, build the scheduler, warm the kernels.

    `show`: print the progress bar and the boot line on stderr (default: when stderr is a terminal).
    `bytes_fallback`: a GGUF without a vocabulary gets the byte tokenizer instead of an error.
    `scheduler=False` (diagnostics that run the model themselves): no scheduler; the kernels are
    warmed on the calling thread, the one that will run them.
    """
    from engine.gguf.aliases import default_model

    show = sys.stderr.isatty() if show is None else show
    name = model if model is not None else default_model()
    opts = sched or SchedOptions.resolve()
    compiling: contextlib.AbstractContextManager[CompileProgress | None] = contextlib.nullcontext(None)
    if show and (cold := cold_kernels()) is not None:  # say why the first run is slow before it is
        from rich.console import Console

        from fak.runtime.compile_progress import CompileProgress

        print(f"fak: compiling the kernels for this CPU (first run only, about half a minute; cached in {cold.parent})",
              file=sys.stderr, flush=True)
        compiling = CompileProgress(Console(stderr=True))
    with compiling as cp:
        return _boot(name, resident, opts, show, bytes_fallback, scheduler, cp)


def _boot(name: str, resident: bool, opts: SchedOptions, show: bool, bytes_fallback: bool,
          scheduler: bool, cp: CompileProgress | None) -> Booted:
    from engine.errors import EngineError
    from engine.gguf.aliases import resolve_model
    from engine.model.loader import load_model
    from engine.sched.scheduler import NativeScheduler

    try:
        path = None if name == "synthetic" else resolve_model(name)
        t0 = time.perf_counter()
        m = load_model(str(path) if path is not None else "synthetic", resident=resident, progress=show)
        load_s = time.perf_counter() - t0
        if cp is not None:
            cp.start()  # the weights' bar is done: the kernels' rows take the screen
        m.kv_dtype = opts.kv_dtype  # every pool built over this model (scheduler, P/D, stages) stores this
        tok = tokenizer_for(m, path, bytes_fallback)
        text_ok = tok is not None and tok.vocab_size >= m.config.vocab_size
        eos = eos_ids(tok, m.config)
        if scheduler:
            # warm=True: the scheduler's own thread loads the numba kernels before any request (so no
            # request, nor its tok/s figure, pays for them) and is then the only thread that runs them
            sched_ = NativeScheduler(m, tokenizer=tok if text_ok else None, eos_ids=eos, warm=True,
                                     speculative=opts.speculative, spec_tokens=opts.spec_tokens,
                                     **opts.as_kwargs(), **opts.cache_kwargs(m))
            sched_.warmed.wait()
            warm_s = sched_.warm_s
        else:
            from engine.model.session import warmup

            sched_, t1 = None, time.perf_counter()
            warmup(kv_dtype=opts.kv_dtype)  # the workers' pools (P/D, stages) hold this type
            warm_s = time.perf_counter() - t1
    except EngineError as exc:
        raise FakError(str(exc)) from None
    b = Booted(name, path, m, tok, sched_, resident and path is not None, load_s, warm_s)
    if show:
        print(b.boot_line(), file=sys.stderr)
    return b


def eos_ids(tokenizer: Any, config: Any) -> tuple[int, ...]:
    """The ids that end a generation: the tokenizer's, else the model config's eos id, else none."""
    eos = tuple(getattr(tokenizer, "eos_ids", ()) or ()) if tokenizer is not None else ()
    if not eos and getattr(config, "eos_id", None) is not None:
        eos = (config.eos_id,)
    return eos


def tokenizer_for(model: Any, path: Path | None, bytes_fallback: bool = False) -> Any:
    """The model's tokenizer: the one its GGUF embeds, the byte tokenizer for the synthetic model, and
    (with `bytes_fallback`) the byte tokenizer for a GGUF without a vocabulary; None if it has none."""
    from engine.tokenizer.tokenizer import ByteTokenizer, load_tokenizer
    from engine.tokenizer.vocab import NoTokenizer

    if path is None:
        return ByteTokenizer()
    try:
        return load_tokenizer(str(path))
    except NoTokenizer:
        return ByteTokenizer() if bytes_fallback else None



def boot_for_text(model: str, who: str, *, resident: bool = True, sched: SchedOptions | None = None) -> Booted:
    """`boot` for a server that speaks text (fak serve, guard, chat, agent): a model without a tokenizer
    is a one-line error naming the command, not a server that answers nothing."""
    b = boot(model, resident=resident, sched=sched, show=False)
    if not b.text_ok:
        b.close()
        raise FakError(f"{model}: no tokenizer for text: {who} needs one")
    return b
