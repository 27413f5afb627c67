"""A dead worker's entries in Dynamo's file discovery backend: the ones of its instance id, and no other's, are
removed (its endpoint instance and model card); a worker that recorded no id, or whose entries are gone, leaves
everything as it was."""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_kit.serve.dynamo.discovery import instance_file, withdraw, write_instance

ENTRY = "trtllm%2Dkit%2Fworker%2Fgenerate%2F{:x}"  # the file backend's name of an instance (and its model card)


def _register(discovery: Path, instance_id: int, port: int) -> str:
    """The entries a worker's registration writes (as Dynamo 1.6's file backend does); their file name."""
    name = ENTRY.format(instance_id)
    for registry, record in (("instances", {"type": "Endpoint", "instance_id": instance_id,
                                            "transport": {"tcp": f"127.0.0.1:{port}/{instance_id:x}"}}),
                             ("mdc", {"display_name": "builtin:tiny-llama"})):
        (discovery / "v1" / registry).mkdir(parents=True, exist_ok=True)
        (discovery / "v1" / registry / name).write_text(json.dumps(record))
    return name


def test_a_dead_worker_s_entries_alone_are_withdrawn(tmp_path: Path) -> None:
    discovery, ready = tmp_path / "discovery", tmp_path / "ready"
    dead, alive = 18215768850392725696, 848224897517726068
    dead_name, alive_name = _register(discovery, dead, 40629), _register(discovery, alive, 45783)
    (discovery / "v1" / "instances" / "being-written").write_text('{"instance_')  # not JSON: left alone
    write_instance(ready / "worker-0", dead)
    write_instance(ready / "worker-1", alive)
    assert instance_file(ready / "worker-0").read_text() == f"{dead}\n"
    assert sorted(p.name for p in ready.iterdir()) == ["worker-0.instance", "worker-1.instance"]  # no .part left

    assert withdraw(discovery, ready / "worker-0") == [dead_name]
    assert sorted(p.name for p in (discovery / "v1" / "instances").iterdir()) == sorted([alive_name, "being-written"])
    assert [p.name for p in (discovery / "v1" / "mdc").iterdir()] == [alive_name]
    assert withdraw(discovery, ready / "worker-0") == []  # gone already


def test_a_worker_without_a_recorded_id_withdraws_nothing(tmp_path: Path) -> None:
    discovery = tmp_path / "discovery"
    name = _register(discovery, 848224897517726068, 45783)
    assert withdraw(discovery, tmp_path / "ready" / "worker-0") == []
    write_instance(tmp_path / "ready" / "worker-1", 848224897517726068)
    assert withdraw(tmp_path / "empty", tmp_path / "ready" / "worker-1") == []  # a discovery without entries
    assert [p.name for p in (discovery / "v1" / "instances").iterdir()] == [name]
