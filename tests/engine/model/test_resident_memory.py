"""Memory "Must show": the RSS a resident Gemma 3 270M load adds stays <= 1.2 x the file (plain beside it)."""

from __future__ import annotations

import pytest

from engine.gguf.aliases import resolve_model
from engine.model.diag import measure_load_rss

pytestmark = pytest.mark.slow  # boots a model or a server per module: the full suite runs it


@pytest.mark.gemma
def test_resident_load_adds_at_most_1_2x_file_size() -> None:
    path = resolve_model("gemma3-270m")
    res = measure_load_rss(path, resident=True)
    plain = measure_load_rss(path, resident=False)
    f = res["file_bytes"]
    print(f"\nfile {f / 2**20:.1f} MiB | resident adds {res['after_load'] / 2**20:.1f} MiB after load, "
          f"{res['after_forward'] / 2**20:.1f} MiB ({res['after_forward'] / f:.2f}x) after a forward | "
          f"plain adds {plain['after_load'] / 2**20:.1f} MiB ({plain['after_load'] / f:.2f}x)")
    assert res["after_load"] <= 1.2 * f
    assert res["after_forward"] <= 1.2 * f  # every weight page touched: still the blocks, no float32 copy
    assert plain["after_load"] > 3 * f  # the figure beside it: the float32 plan
