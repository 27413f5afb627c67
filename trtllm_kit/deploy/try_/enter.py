"""A container's start, run as root in the pod's network namespace and a fresh mount and UTS namespace
(``python -m trtllm_kit.deploy.try_.enter SPEC.json``): this machine's root copy-on-write, the image's links, the
container's volumes at their ``mountPath``s and nowhere else, ``/etc/hosts``, then ``chroot``, the container's user
and ``exec`` of its command with its environment only (the process keeps this pid, so signals reach the command).

It imports nothing heavy: it runs once per container before the command does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"deploy try: mount {' '.join(args)} failed: {done.stderr.strip()}")


def _inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def prepare_root(spec: dict[str, Any]) -> Path:
    """The container's root: an overlay of ``/`` whose writes stay in memory, the kernel's file systems, the
    image's links, the given files and the volumes.

    Arguments:
        spec: ``root`` (a directory for the layers), ``links``, ``files``, ``mounts`` ({source, target, readOnly}).
    """
    layers = Path(spec["root"])
    _mount("--make-rprivate", "/")
    _mount("-t", "tmpfs", "tmpfs", str(layers))
    for name in ("upper", "work", "merged"):
        (layers / name).mkdir()
    merged = layers / "merged"
    _mount("-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={layers / 'upper'},workdir={layers / 'work'}",
           str(merged))
    for system in ("/proc", "/sys", "/dev"):
        _mount("--rbind", system, str(_inside(merged, system)))
    for path, target in spec.get("links", {}).items():
        link = _inside(merged, path)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    for path in spec.get("traversable", []):
        inner = _inside(merged, path)
        if inner.is_dir():
            inner.chmod(inner.stat().st_mode | 0o011)
    for path, text in spec.get("files", {}).items():
        _inside(merged, path).parent.mkdir(parents=True, exist_ok=True)
        _inside(merged, path).write_text(text)
    for mount in sorted(spec.get("mounts", []), key=lambda m: len(Path(m["target"]).parts)):
        target = _inside(merged, mount["target"])
        for parent in Path(mount["target"]).parents:  # a runtime makes missing ones 0755; this machine's may be 0700
            inner = _inside(merged, str(parent))
            if str(parent) != "/" and inner.is_dir():
                inner.chmod(inner.stat().st_mode | 0o011)
        if Path(mount["source"]).is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        _mount("--bind", mount["source"], str(target))
        if mount.get("readOnly"):
            _mount("-o", "remount,bind,ro", str(target))
    return merged


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[1]).read_text())
    root = prepare_root(spec)
    if spec.get("hostname"):
        socket.sethostname(spec["hostname"])
    os.chroot(root)
    os.chdir(spec.get("workdir") or "/")
    os.setgroups(spec.get("groups", []))
    os.setgid(spec.get("gid", 0))
    os.setuid(spec.get("uid", 0))
    command = spec["argv"]
    try:
        os.execvpe(command[0], command, spec["env"])
    except OSError as exc:
        sys.stderr.write(f"deploy try: cannot run {command[0]!r} in the container: {exc.strerror}\n")
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv)
