"""The scheduler flags every model-using subcommand takes (resolved by fak.runtime.boot.SchedOptions)."""

from __future__ import annotations

import typer

# typer reads these as the parameters' defaults; one definition, so every subcommand spells them alike
MAX_RUNNING = typer.Option(None, "--max-running", help="Scheduler: running lanes cap, 0 = unbounded [FAK_MAX_RUNNING].")
KV_BLOCKS = typer.Option(None, "--kv-blocks", help="Scheduler: KV budget in blocks (default growable) [FAK_KV_BLOCKS].")
BLOCK_TOKENS = typer.Option(None, "--block-tokens", help="Scheduler: tokens per KV block (16) [FAK_BLOCK_TOKENS].")
PREEMPT = typer.Option(None, "--preempt", help="Scheduler: swap | recompute [FAK_PREEMPT].")
VICTIM = typer.Option(None, "--victim", help="Scheduler: most-recent | cost-aware [FAK_VICTIM].")
PREFIX_CACHE_GIB = typer.Option(None, "--prefix-cache-gib", help="Prefix cache: GiB of KV kept in memory for "
                                "reuse (default a quarter of RAM) [FAK_PREFIX_CACHE_GIB].")
KV_CACHE_DIR = typer.Option(None, "--kv-cache-dir", help="Prefix cache on disk: KV that survives a restart "
                            "(default ~/.cache/fak/kv/<model>) [FAK_KV_CACHE_DIR, 'off' disables].")
KV_DTYPE = typer.Option(None, "--kv-dtype", help="KV cache element type: f32 | f16 | bf16 (half the bytes "
                        "of f32 for long contexts) [FAK_KV_DTYPE].")
NO_KV_CACHE_DIR = typer.Option(False, "--no-kv-cache-dir", help="No KV on disk (nothing persisted, nothing read).")
KV_CACHE_DISK_GIB = typer.Option(None, "--kv-cache-disk-gib", help="Bound of the KV on disk, LRU (default 20) "
                                 "[FAK_KV_CACHE_DISK_GIB].")

SPECULATIVE = typer.Option(None, "--speculative", help="Speculative decoding: off | ngram (drafts from the "
                           "lane's own prompt and output) | suffix (and recent outputs of its scope) "
                           "[FAK_SPECULATIVE].")
SPEC_TOKENS = typer.Option(None, "--spec-tokens", help="Longest draft a lane may earn (8; adaptive per lane) "
                           "[FAK_SPEC_TOKENS].")


def spec_flags(speculative: str | None, spec_tokens: int | None) -> dict[str, object]:
    return {"speculative": speculative, "spec_tokens": spec_tokens}


def cache_flags(prefix_cache_gib: float | None, kv_cache_dir: str | None, no_kv_cache_dir: bool,
                kv_cache_disk_gib: float | None, kv_dtype: str | None) -> dict[str, object]:
    """The KV cache flags as SchedOptions.resolve keywords (--no-kv-cache-dir wins over a directory)."""
    from fak.errors import FakError

    if no_kv_cache_dir and kv_cache_dir is not None:
        raise FakError("--kv-cache-dir and --no-kv-cache-dir contradict each other")
    return {"prefix_cache_gib": prefix_cache_gib, "kv_cache_dir": "off" if no_kv_cache_dir else kv_cache_dir,
            "kv_cache_disk_gib": kv_cache_disk_gib, "kv_dtype": kv_dtype}


KEY = typer.Option(None, "--key", help="Cluster key: every worker link is handshaken on it and every message "
                   "sealed; the same on every worker and head (prefer the env var: argv is visible) [FAK_PD_KEY].")
LINK_ENCRYPT = typer.Option(False, "--link-encrypt", help="Encrypt worker links too (AES-256-GCM), not only "
                            "authenticate them; needs the cluster key [FAK_LINK_ENCRYPT=1].")


def link_flags(key: str | None, link_encrypt: bool) -> dict[str, object]:
    """The cluster key (bytes, b"" for none) and whether links are encrypted, from the flags or the env."""
    import os

    from fak.errors import FakError

    secret = (key or os.environ.get("FAK_PD_KEY") or "").encode()
    encrypt = link_encrypt or os.environ.get("FAK_LINK_ENCRYPT", "").lower() in ("1", "true", "yes", "on")
    if encrypt and not secret:
        raise FakError("--link-encrypt needs the cluster key (--key or FAK_PD_KEY)")
    from engine.wire.secure import LinkKey, LinkRefused

    try:
        LinkKey.of(secret)  # too short: one line now, before a model is loaded
    except LinkRefused as e:
        raise FakError(f"--key / FAK_PD_KEY: {e}") from None
    return {"key": secret, "encrypt": encrypt}
