"""Files read from a path someone else named: only a regular file, inside a given directory, up to a size, before a
deadline.

The file's type is read from the path before it is opened and again from the open descriptor, and the open is
non-blocking, so a FIFO, a device, a socket or a directory where a file is expected is refused at once instead of
blocking or reading without end. A link is followed only when it stays inside ``root``; where ``/proc`` shows
it, the check is made again on the descriptor actually opened, so a link swapped in between is seen too. A read
that has not finished by its deadline is given up between chunks.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from types import TracebackType

from trtllm_kit.errors import KitUsageError

READ_DEADLINE_S = 60.0  # the longest a bounded read may take
CHUNK_BYTES = 1 << 20
KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnsafeFileError(KitUsageError):
    """A file the kit will not read: not a regular file, outside its directory, too large or too slow."""


class BoundedFile:
    """A regular file inside ``root``, of at most ``max_bytes``, open for reading before a deadline.

    Arguments:
        path: the file; root: the directory it and every link on its way must stay inside;
        max_bytes: its largest allowed size; deadline_s: the time its reads may take, from the open;
        bounded_as: what ``max_bytes`` is the bound of, for the refusal.
    """

    def __init__(self, path: Path, *, root: Path, max_bytes: int, deadline_s: float = READ_DEADLINE_S,
                 bounded_as: str = "this file") -> None:
        self.path, self.max_bytes, self.deadline_s = path, max_bytes, deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.fd = _open_inside(path, root)
        try:
            info = os.fstat(self.fd)
            _check_regular(path, info.st_mode)
            if info.st_size > max_bytes:
                raise UnsafeFileError(f"{path} is {info.st_size} bytes, above the bound of {max_bytes} bytes for "
                                      f"{bounded_as}; it is not the file the kit expects there: replace it.")
        except BaseException:
            os.close(self.fd)
            raise
        self.size = info.st_size
        self.offset = 0

    def read(self, num_bytes: int) -> bytes:
        """The next ``num_bytes`` (fewer only at the end), read in chunks while the deadline holds.

        Arguments:
            num_bytes: how many bytes to read.
        """
        if self.offset + num_bytes > self.max_bytes:
            raise UnsafeFileError(f"{self.path} grew past the bound of {self.max_bytes} bytes while it was read; "
                                  "replace it with a file that is not being written.")
        parts = []
        left = num_bytes
        while left > 0:
            if time.monotonic() >= self.deadline:
                raise UnsafeFileError(f"{self.path} took more than {self.deadline_s:g} s to read ({self.offset} of "
                                      f"{self.size} bytes); copy it to a local disk.")
            part = os.read(self.fd, min(left, CHUNK_BYTES))
            if not part:
                break
            parts.append(part)
            left -= len(part)
            self.offset += len(part)
        return b"".join(parts)

    def read_all(self) -> bytes:
        """The rest of the file (at most ``max_bytes`` in all)."""
        data = self.read(self.max_bytes - self.offset)
        if os.read(self.fd, 1):
            raise UnsafeFileError(f"{self.path} grew past the bound of {self.max_bytes} bytes while it was read; "
                                  "replace it with a file that is not being written.")
        return data

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> BoundedFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def read_bounded(path: Path, *, root: Path, max_bytes: int, deadline_s: float = READ_DEADLINE_S,
                 bounded_as: str = "this file") -> bytes:
    """The bytes of the regular file ``path``, inside ``root`` and at most ``max_bytes`` long, read before a deadline.

    Arguments:
        path: the file; root: the directory it must stay inside (links included); max_bytes: its largest size;
        deadline_s: the time the read may take; bounded_as: what ``max_bytes`` is the bound of, for the refusal.
    """
    with BoundedFile(path, root=root, max_bytes=max_bytes, deadline_s=deadline_s, bounded_as=bounded_as) as file:
        return file.read_all()


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or below it (both resolved)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _open_inside(path: Path, root: Path) -> int:
    """A read-only, non-blocking descriptor of ``path`` after its links are resolved inside ``root``."""
    try:
        real_root = os.path.realpath(root)
        target = os.path.realpath(path)
        if not is_inside(target, real_root):
            raise UnsafeFileError(f"{path} leads to {target}, outside {real_root}; the kit follows links only inside "
                                  "that directory: put the file itself there.")
        _check_regular(path, os.stat(target).st_mode)
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UnsafeFileError(f"{str(path)[:300]} cannot be opened ({reason}); give a readable regular file.") from None
    opened = _descriptor_path(fd)
    if opened is not None and not is_inside(opened, real_root):
        os.close(fd)
        raise UnsafeFileError(f"{path} was replaced by a link to {opened}, outside {real_root}, while it was opened; "
                              "put the file itself there.")
    return fd


def _check_regular(path: Path, mode: int) -> None:
    for is_kind, kind in KINDS:
        if is_kind(mode):
            raise UnsafeFileError(f"{path} is {kind}, not a regular file; the kit reads only regular files there: "
                                  "put the file itself in its place.")


def _descriptor_path(fd: int) -> str | None:
    """What ``fd`` is open on, as the kernel names it (None where ``/proc`` does not say)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
