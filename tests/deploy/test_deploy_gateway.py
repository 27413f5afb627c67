"""API keys on Kubernetes: `--api-keys-secret` mounts the key file for the gateway (one node and the multi-node
leader's frontend), and the usage log reaches stdout as JSON lines through the sidecar's own command, run here on a
log the real gateway writes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import aiohttp
from deploy_helpers import IMAGE, deploy, objects

from trtllm_kit.cli import run
from trtllm_kit.deploy.gateway import USAGE_LOG
from trtllm_kit.deploy.leader_plan import FrontendPlan
from trtllm_kit.serve.gateway.keys import add_key
from trtllm_kit.serve.gateway.usage import UsageLog, UsageRecord
from trtllm_kit.serve.server.launcher import free_port

NAME = "llama-3-1-70b-instruct"
KEYS = {"name": "api-keys", "secret": {"secretName": "team-keys", "defaultMode": 0o440,
                                       "items": [{"key": "keys.json", "path": "keys.json"}]}}


def test_one_node_mounts_the_keys_and_streams_the_usage_log(artifact, tmp_path, capsys):
    deploy(artifact(tp=2), tmp_path / "k8s", capsys, "--pvc", "models", "--api-keys-secret", "team-keys")
    assert run(["deploy", "check", str(tmp_path / "k8s")]) == 0
    spec = objects(tmp_path / "k8s")[f"Deployment/{NAME}"]["spec"]["template"]["spec"]
    server = spec["containers"][0]
    command = " ".join(server["command"])
    assert f"--api-keys /etc/trtllm-kit/api-keys/keys.json --usage-log {USAGE_LOG}" in command
    assert KEYS in spec["volumes"] and {"name": "usage", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]
    assert {"name": "api-keys", "mountPath": "/etc/trtllm-kit/api-keys", "readOnly": True} in server["volumeMounts"]
    sidecar = spec["initContainers"][1]
    assert (sidecar["name"], sidecar["restartPolicy"]) == ("usage-log", "Always")
    assert sidecar["command"] == ["tail", "-n", "+1", "-F", USAGE_LOG]


def test_the_usage_log_reaches_stdout_as_json_lines(tmp_path):
    """The sidecar's command on a log the gateway's own ``UsageLog`` writes, before and after it starts."""
    log_path = tmp_path / "usage.jsonl"
    log = UsageLog(log_path)
    first = UsageRecord(time.time(), "team-a", "acme", "llama", 12, 30)
    log.append(first)
    command = ["tail", "-n", "+1", "-F", str(log_path)]
    tail = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        second = UsageRecord(time.time(), "team-b", None, "llama", 5, 7)
        log.append(second)
        assert tail.stdout is not None
        lines = [tail.stdout.readline() for _ in range(2)]
    finally:
        tail.terminate()
        tail.wait(timeout=30)
        log.close()
    assert [json.loads(line) for line in lines] == [vars(first), vars(second)]


def test_the_multi_node_leader_serves_with_the_keys(artifact, tmp_path, capsys):
    deploy(artifact(tp=8), tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--api-keys-secret", "team-keys")
    found = objects(tmp_path / "k8s")
    plan = json.loads(found[f"ConfigMap/{NAME}-launch"]["data"]["plan.json"])
    assert plan["frontend"]["api_keys"] == "/etc/trtllm-kit/api-keys/keys.json"
    assert plan["frontend"]["usage_log"] == USAGE_LOG
    group = found[f"LeaderWorkerSet/{NAME}"]["spec"]["leaderWorkerTemplate"]
    assert KEYS in group["leaderTemplate"]["spec"]["volumes"]
    assert [c["name"] for c in group["leaderTemplate"]["spec"]["initContainers"]] == ["fetch-artifact", "usage-log"]
    assert KEYS not in group["workerTemplate"]["spec"]["volumes"]
    assert [c["name"] for c in group["workerTemplate"]["spec"]["initContainers"]] == ["fetch-artifact"]


def test_llmapi_across_nodes_refuses_the_gateway(artifact, tmp_path, capsys):
    code = run(["deploy", "k8s", str(artifact(target="llmapi", tp=8)), "--out", str(tmp_path / "k8s"), "--pvc",
                "models", "--gpus-per-node", "4", "--image", IMAGE, "--api-keys-secret", "team-keys"])
    assert code == 2 and "is served by trtllm-serve" in capsys.readouterr().err


def test_the_leader_frontend_requires_a_key(artifact, tmp_path):
    """The frontend the leader starts beside rank 0, with the gateway reading a real key file: a request without a
    key is refused, one with a key is answered (the model list needs no Triton)."""
    from trtllm_kit.deploy.leader_frontend import start

    out = artifact(tp=8)
    keys = tmp_path / "keys.json"
    secret, _ = add_key(keys, "team-a")
    port = free_port()
    plan = FrontendPlan(out=str(out), served_name="llama70b", text_model="tensorrt_llm_bls", port=port,
                        host="127.0.0.1", grpc_url=f"127.0.0.1:{free_port()}", api_keys=str(keys),
                        usage_log=str(tmp_path / "u.jsonl"))

    async def exercise() -> tuple[int, int, dict]:
        runner = await start(plan, "unused-token")
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}/v1/models"
                async with session.get(url) as refused:
                    refused_status = refused.status
                async with session.get(url, headers={"Authorization": f"Bearer {secret}"}) as answered:
                    return refused_status, answered.status, await answered.json()
        finally:
            await runner.cleanup()

    refused, answered, body = asyncio.run(exercise())
    assert (refused, answered) == (401, 200)
    assert [m["id"] for m in body["data"]] == ["llama70b"]
    assert Path(tmp_path / "u.jsonl").exists()
