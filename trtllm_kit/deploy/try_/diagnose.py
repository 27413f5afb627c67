"""Causes a failed ``deploy try`` names in one sentence, found by looking where the kubelet would not."""

from __future__ import annotations

import os
from pathlib import Path

from trtllm_kit.deploy.try_.containers import Container

MAX_ENTRIES = 20_000  # a bounded walk: an artifact directory has tens of files


def _outside(target: str, mount_paths: list[str]) -> bool:
    return os.path.isabs(target) and not any(target == p or target.startswith(p.rstrip("/") + "/")
                                             for p in mount_paths)


def dangling_links(container: Container) -> str | None:
    """The sentence for a container that reads links into a path it does not mount (``--pvc`` without the claim in
    the server), or None.

    Arguments:
        container: a container that failed.
    """
    mounts = [(m["name"], str(m["mountPath"])) for m in container.spec.get("volumeMounts") or []]
    paths = [path for _, path in mounts]
    for name, path in mounts:
        source = container.pod.volumes.get(name)
        if source is None or not source.is_dir():
            continue
        seen, found = 0, []
        for root, dirs, files in os.walk(source):
            for entry in [*dirs, *files]:
                seen += 1
                link = Path(root) / entry
                if link.is_symlink() and _outside(os.readlink(link), paths):
                    found.append((link.relative_to(source), os.readlink(link)))
            if seen > MAX_ENTRIES:
                break
        if found:
            inner, target = found[0]
            into = "/" + "/".join(Path(target).parts[1:2])
            return (f"container {container.name} reads {len(found)} links under {path} that point into {into} "
                    f"(e.g. {inner} → {target}), which it does not mount, so every one dangles; deliver the files "
                    "themselves (deploy k8s --pvc mounts the claim read-only at the artifact's path in every "
                    "container that reads it)")
    return None
