"""Reading a JSON file the user or a tool wrote, with the kit's one-sentence errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError


def read_json(path: Path, missing: str, error: type[KitError] = KitError) -> Any:
    """The JSON value in ``path``.

    Arguments:
        path: the file.
        missing: the sentence raised when there is no such file (what it should be, what to do).
        error: the exception class raised, which sets the exit code.
    """
    if not path.is_file():
        raise error(missing)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}).") from None
