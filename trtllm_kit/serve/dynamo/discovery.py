"""A worker's entries in Dynamo's file discovery backend, withdrawn as soon as the serve sees the worker dead.

Dynamo's file backend (``DYN_FILE_KV``) keeps a worker's endpoint instance (``v1/instances``) and model card
(``v1/mdc``), one file each under the same name, until their lease runs out, seconds after the worker died. Until
then the router still picks the dead worker: a new request sent there fails ("Service temporarily unavailable"), and
so does a stream migrated from another dead worker once every attempt ``--migration-limit`` allows has gone to dead
ones. So each worker writes its instance id beside its ready file before it is ready, and the serve's watch
(``run.py``) removes the entries of a worker that exited; Dynamo's frontend drops the worker at once.
"""

from __future__ import annotations

import json
from pathlib import Path

INSTANCE_SUFFIX = ".instance"  # beside the ready file ``worker-N``: ``worker-N.instance``
REGISTRIES = ("instances", "mdc")  # under DYN_FILE_KV/v1: the entries of one worker share a file name
FILE_KV_VERSION = "v1"


def instance_file(ready_file: Path) -> Path:
    """Where the worker whose ready file is ``ready_file`` writes its Dynamo instance id.

    Arguments:
        ready_file: the worker's ready file (``DynamoDirs.ready_file``).
    """
    return ready_file.with_suffix(INSTANCE_SUFFIX)


def write_instance(ready_file: Path, instance_id: int) -> None:
    """Record the worker's instance id (whole, or not there yet), before its ready file.

    Arguments:
        ready_file: the worker's ready file; instance_id: its endpoint's ``connection_id()``.
    """
    path = instance_file(ready_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f"{path.name}.part")
    written.write_text(f"{instance_id}\n")
    written.replace(path)


def withdraw(discovery: Path, ready_file: Path) -> list[str]:
    """Remove the discovery entries of the (dead) worker whose ready file is ``ready_file``; their file names (none
    when it recorded no instance id or its entries are gone already).

    Arguments:
        discovery: the serve's ``DYN_FILE_KV`` directory; ready_file: the worker's ready file.
    """
    try:
        instance_id = int(instance_file(ready_file).read_text())
    except (OSError, ValueError):
        return []
    root = discovery / FILE_KV_VERSION
    removed = []
    for entry in sorted((root / REGISTRIES[0]).glob("*")):
        try:
            record = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("instance_id") == instance_id:
            for registry in REGISTRIES:
                (root / registry / entry.name).unlink(missing_ok=True)
            removed.append(entry.name)
    return removed
