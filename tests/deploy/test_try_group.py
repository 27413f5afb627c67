"""`deploy try` on a LeaderWorkerSet: an engine artifact of tp 2 on nodes of one GPU is a group of two pods; the
leader and the worker get the controller's names and DNS, the worker's sshd accepts the leader's key, and the
leader's `mpirun` starts a tritonserver rank on each pod, which then fails where it would begin GPU work (this
machine has no GPU and no TensorRT-LLM backend). Needs Debian's openmpi-bin and openssh-server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from deploy_artifacts import write_artifact
from deploy_helpers import IMAGE

from trtllm_kit.cli import run
from trtllm_kit.deploy.try_.try_directory import try_directory

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "mpirun", "sshd")),
    reason="deploy try runs pods in namespaces of their own (root, unshare); the group needs mpirun and sshd")


def test_the_group_starts_a_rank_on_each_pod(tmp_path):
    art = write_artifact(tmp_path / "artifact", tp=2, rank_bytes=1000)
    manifest = json.loads((art / "manifest.json").read_text())
    for name in manifest["outputs"]:  # the files the manifest lists, present and hashed as the init container checks
        path = art / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(b"\0" * 1000)
        manifest["outputs"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (art / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "k8s"
    assert run(["deploy", "k8s", str(art), "--out", str(out), "--pvc", "models", "--gpus-per-node", "1", "--name",
                "llama", "--worker-wait", "60", "--image", IMAGE]) == 0

    report = try_directory(out, {"models": art}, timeout_s=180)
    leader, worker = report.pods
    assert (leader.name, worker.name) == ("llama-0", "llama-0-1")
    # the worker's sshd listens on 2222 (its readiness probe) and took the leader's key, reached by its DNS name
    assert [p.description for p in worker.probes] == ["readinessProbe TCP :2222 every 5 s, 3 failures"]
    assert worker.ready_after_s is not None
    assert "Server listening on 0.0.0.0 port 2222" in worker.logs["server"]
    assert "Accepted publickey for" in worker.logs["server"] and f"from {leader.address} " in worker.logs["server"]
    # mpirun started one tritonserver per rank (the worker's output comes back through mpirun); each stopped at
    # CUDA, where a GPU node's rank would load its engine
    assert leader.logs["server"].count("CudaDriverHelper has not been initialized") >= 2
    assert leader.logs["server"].count("error: creating server") == 2
    assert report.failure is not None and "mpirun exited with 1 before rank 0 was ready" in report.failure
    assert report.answer is None
