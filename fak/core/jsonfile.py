"""Reading the JSON files a user hands fak (traces, policies): every problem is one FakError naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fak.errors import FakError


def read_json(path: str | os.PathLike[str], kind: str) -> Any:
    """The parsed JSON of `path`; `kind` ("trace", "policy") names the file in errors."""
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FakError(f"{src}: no such {kind} file") from None
    except IsADirectoryError:
        raise FakError(f"{src}: is a directory, expected a {kind} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FakError(f"{src}: cannot read {kind}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FakError(f"{src}: {kind} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
