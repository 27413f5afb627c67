"""``safe_files``: a regular file inside its directory is read; a FIFO, a device, a socket, a directory, a link out of
the directory, a file above its bound and a read past its deadline are refused, each in one sentence and without
blocking."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from trtllm_kit.safe_files import BoundedFile, UnsafeFileError, read_bounded


def read_soon(path: Path, root: Path, max_bytes: int = 1 << 20) -> bytes:
    """``read_bounded``, failing the test if it has not returned in 30 s (a blocked open never does)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["data"] = read_bounded(path, root=root, max_bytes=max_bytes)
        except UnsafeFileError as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # let it go
        pytest.fail(f"reading {path} blocked")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["data"]  # type: ignore[return-value]


def test_a_regular_file_and_a_link_inside_are_read(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file").write_bytes(b"x" * 3000)
    (tmp_path / "link").symlink_to("sub/file")
    assert read_soon(tmp_path / "sub" / "file", tmp_path) == b"x" * 3000
    assert read_soon(tmp_path / "link", tmp_path, max_bytes=3000) == b"x" * 3000


def test_what_is_not_a_regular_file_inside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    (root / "zero").symlink_to("/dev/zero")
    (tmp_path / "secret").write_text("not yours")
    (root / "out").symlink_to("../secret")
    (root / "loop").symlink_to("loop")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock"))
    cases = {"fifo": "is a FIFO, not a regular file", "dir": "is a directory, not a regular file",
             "sock": "is a socket, not a regular file", "zero": "leads to /dev/zero, outside",
             "out": f"leads to {tmp_path}/secret, outside {root};", "missing": "cannot be opened (No such file",
             "loop": "cannot be opened"}
    try:
        for name, words in cases.items():
            with pytest.raises(UnsafeFileError) as refused:
                read_soon(root / name, root)
            assert words in str(refused.value), (name, str(refused.value))
        with pytest.raises(UnsafeFileError, match="is a character device"):
            read_soon(Path("/dev/zero"), Path("/dev"))
    finally:
        server.close()


def test_sizes_and_deadlines_are_bounds(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"y" * 5000)
    with pytest.raises(UnsafeFileError, match=r"big is 5000 bytes, above the bound of 4999 bytes for this file"):
        read_soon(tmp_path / "big", tmp_path, max_bytes=4999)
    with open(tmp_path / "big", "ab") as grow, BoundedFile(tmp_path / "big", root=tmp_path, max_bytes=5000) as file:
        grow.write(b"z")  # it grows after the open
        grow.flush()
        with pytest.raises(UnsafeFileError, match="grew past the bound of 5000 bytes"):
            file.read_all()
    (tmp_path / "slow").write_bytes(b"s" * (4 << 20))
    slow = BoundedFile(tmp_path / "slow", root=tmp_path, max_bytes=8 << 20, deadline_s=0)
    with slow, pytest.raises(UnsafeFileError, match=r"took more than 0 s to read \(0 of 4194304 bytes\)"):
        slow.read_all()
