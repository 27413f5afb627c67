"""The llmapi target across nodes: a LeaderWorkerSet whose leader runs upstream's multi-node launch of the
PyTorch backend (`mpirun ... trtllm-llmapi-launch trtllm-serve ...`), health on /health, metrics on
/prometheus/metrics, the autoscaler on trtllm-serve's queue."""

from __future__ import annotations

import sys

import yaml
from deploy_helpers import STAND_IN_RANKS, FakeClock, deploy, objects

from trtllm_kit.deploy.leader import Leader
from trtllm_kit.deploy.leader_plan import LeaderPlan
from trtllm_kit.deploy.render import check_dir
from trtllm_kit.serve.server.launcher import free_port

NAME = "llama-3-1-70b-instruct"


def test_llmapi_tp8_on_two_nodes(artifact, tmp_path, capsys):
    written = deploy(artifact(target="llmapi", tp=8), tmp_path / "k8s", capsys, "--pvc", "models",
                     "--gpus-per-node", "4")
    assert written["num_nodes"] == 2 and check_dir(tmp_path / "k8s")[1] == []
    found = objects(tmp_path / "k8s")
    group = found[f"LeaderWorkerSet/{NAME}"]["spec"]["leaderWorkerTemplate"]
    leader = group["leaderTemplate"]["spec"]["containers"][0]
    assert leader["ports"] == [{"name": "openai", "containerPort": 9000}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert leader[probe]["httpGet"] == {"path": "/health", "port": "openai"}
    monitor = found[f"PodMonitor/{NAME}"]["spec"]["podMetricsEndpoints"]
    assert [(e["port"], e["path"]) for e in monitor] == [("openai", "/prometheus/metrics")]
    query = found[f"ScaledObject/{NAME}"]["spec"]["triggers"][0]["metadata"]["query"]
    # the image is TensorRT-LLM 1.2.1, whose trtllm-serve has no queue gauge: the queue time's rate (Little's law)
    sel = f'namespace="default",app="{NAME}"'
    assert query == (f'sum(rate({{__name__=~"(trtllm_)?request_queue_time_seconds_sum",{sel}}}[1m])) '
                     f'or (0 * count(up{{{sel}}} == 1))')
    launch = found[f"ConfigMap/{NAME}-launch"]["data"]
    plan = yaml.safe_load(launch["plan.json"])
    assert plan["ranks"] == [
        "-n", "8", "trtllm-llmapi-launch", "trtllm-serve", "/models/llama70b/checkpoint", "--host", "0.0.0.0",
        "--port", "9000", "--backend", "pytorch", "--extra_llm_api_options", "/opt/trtllm-kit/llm_api_options.yaml",
        "--tp_size", "8", "--pp_size", "1"]
    assert plan["frontend"] is None and plan["ready_url"] == "http://127.0.0.1:9000/health"
    options = yaml.safe_load(launch["llm_api_options.yaml"])
    assert options == {"backend": "pytorch", "tensor_parallel_size": 8, "pipeline_parallel_size": 1,
                       "enable_iter_perf_stats": True, "return_perf_metrics": True}


def test_the_leader_waits_for_trtllm_serve_health(artifact, tmp_path, capsys):
    deploy(artifact(target="llmapi", tp=8), tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "4")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(objects(tmp_path / "k8s")[f"ConfigMap/{NAME}-launch"]["data"]["plan.json"])
    plan = LeaderPlan.read(plan_path)
    port = free_port()
    plan = LeaderPlan(**{**vars(plan), "ready_url": plan.ready_url.replace(":9000/", f":{port}/")})
    script = tmp_path / "serve.py"
    script.write_text(STAND_IN_RANKS.replace('"/v2/health/ready"', '"/health"'))
    clock = FakeClock()
    leader = Leader(plan, ["w-0-1.w.default"], clock=clock, sleep=clock.sleep, probe=lambda _h, _p: True)
    assert leader.wait_for_workers() == 0
    leader.start([sys.executable, str(script), str(port)])
    try:
        assert leader.wait_ready() < plan.startup_s
    finally:
        assert leader.stop() == 0
