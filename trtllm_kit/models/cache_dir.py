"""A directory of the kit's cache, written once: into a temporary sibling, then renamed into place.

The cache only ever holds complete directories; when two processes race, the loser discards its copy and uses the
winner's. Temporary directories a killed process left behind are removed once they are an hour old.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import platformdirs

from trtllm_kit.errors import KitError

STALE_TMP_SECONDS = 3600  # temporary directories older than this were left by a killed process


def cache_root() -> Path:
    """The kit's cache directory: ``$TRTLLM_KIT_CACHE`` if set, else the platform's user cache."""
    override = os.environ.get("TRTLLM_KIT_CACHE")
    return Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("trtllm-kit"))


def remove_stale_tmp(parent: Path, final_name: str) -> None:
    """Remove temporary directories that a killed process left behind for ``final_name``."""
    for stale in parent.glob(f".{final_name}.*.tmp"):
        try:
            age = time.time() - stale.stat().st_mtime
        except FileNotFoundError:  # its owner renamed or removed it meanwhile
            continue
        if age > STALE_TMP_SECONDS:
            shutil.rmtree(stale, ignore_errors=True)


def cached_dir(final: Path, write: Callable[[Path], None], what: str) -> Path:
    """``final``, written by ``write`` (into an empty temporary directory) unless it already exists.

    Arguments:
        final: the cache directory; write: fills the directory it is given; what: the content, for messages.
    """
    if final.is_dir():
        return final
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(parent, final.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=parent))
    except OSError as exc:
        raise KitError(f"cannot create the model cache in {parent} ({exc.strerror}); "
                       "set TRTLLM_KIT_CACHE to a writable directory.") from None
    try:
        write(tmp)
        tmp.chmod(0o755)
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if final.is_dir():  # another process finished first: its copy is as good as ours
            return final
        raise KitError(f"could not write {what} into {parent} ({exc}); "
                       "set TRTLLM_KIT_CACHE to a writable directory.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
