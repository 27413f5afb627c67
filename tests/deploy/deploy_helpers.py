"""What the deploy tests share: ``deploy k8s`` of an artifact and the objects it wrote, in-place edits that break
them as a real cluster would, a fake clock and stand-in ranks for the multi-node leader, and the tiny build
``deploy try`` runs."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kit_server import TINY_BUILDS, Builds

from trtllm_kit.cli import run

IMAGE = "registry.example/trtllm-kit:0.1.0-trtllm1.2.1"
TIMEOUT_S = 300  # the pods' readiness in ``deploy try``, on a loaded machine


def deploy(artifact: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    """``deploy k8s ARTIFACT --out OUT --json`` with ``args`` (and ``IMAGE`` unless they name one), which must
    succeed; what it printed."""
    image = () if "--image" in args else ("--image", IMAGE)
    code = run(["deploy", "k8s", str(artifact), "--out", str(out), "--json", *image, *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def objects(out: Path) -> dict[str, dict]:
    """Every object of a deploy directory's kustomization, by ``Kind/name``."""
    found = {}
    for name in yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]:
        for doc in yaml.safe_load_all((out / name).read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def rewrite(path: Path, edit: Callable[[dict], object]) -> None:
    """Change the first document of a YAML file in place with ``edit``."""
    docs = list(yaml.safe_load_all(path.read_text()))
    edit(docs[0])
    path.write_text(yaml.safe_dump_all(docs))


def link_the_claim(spec: dict, mount: str) -> None:
    """Rewrite a pod spec to the shape before the fix: the fetch container links the claim (at /pvc) into an
    emptyDir at ``mount``, and the other containers mount that emptyDir only."""
    spec["volumes"].append({"name": "artifact", "emptyDir": {}})
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        mounts = container.get("volumeMounts") or []
        if not any(m["name"] == "pvc" for m in mounts):
            continue
        is_fetch = container["name"] == "fetch-artifact"
        container["volumeMounts"] = [m for m in mounts if m["name"] != "pvc"] + [{"name": "artifact",
                                                                                  "mountPath": mount}]
        if is_fetch:
            container["volumeMounts"].append({"name": "pvc", "mountPath": "/pvc", "readOnly": True})
            container["args"] = [container["args"][0].replace("set -eu; ", f"set -eu; cp -rs /pvc/. {mount}/; ")]


class FakeClock:
    """Seconds that pass only when the leader sleeps (a real pause of a few milliseconds each, so the stand-in
    ranks get scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        time.sleep(0.01)


STAND_IN_RANKS = textwrap.dedent("""
    import http.server, signal, sys
    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
""")


def tiny_copy(kit_builds: Builds, root: Path, target: str) -> Path:
    """A private copy of the session's ``builtin:tiny-llama`` build for ``target`` (``cpu`` or ``llmapi``)."""
    return kit_builds.copy(TINY_BUILDS[target], root / target)
