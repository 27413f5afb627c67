"""The startup budget: the load model against the peers' figures, the probe and the server's deadline agreeing,
`deploy check` refusing a shorter probe, and a multi-node leader whose workers come 5 minutes late staying inside
its probe (the real leader code on a fake clock, its ranks a stand-in process answering the readiness check)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploy_helpers import IMAGE, STAND_IN_RANKS, FakeClock, deploy, objects

from trtllm_kit.cli import run
from trtllm_kit.deploy.leader import Leader
from trtllm_kit.deploy.leader_plan import LeaderPlan
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.startup import FLOOR_S, budgets
from trtllm_kit.errors import KitError
from trtllm_kit.serve.server.launcher import free_port
from trtllm_kit.targets import get_target

GB = 10**9
PEERS_S = (615, 7200)  # the peers' startup allowances (docs/deploy-kubernetes.md): 615 s (production-stack) to 2 h


def source(target: str, tp: int, pp: int, total_bytes: float) -> DeploySource:
    return DeploySource(model="m", target=target, tp_size=tp, pp_size=pp, max_batch_size=64,
                        load_bytes=int(total_bytes), mount_path="/models/m", files=())


# (what, source, GPUs per node, delivery, expected budget in s)
TABLE = [
    # Llama-3.1-8B bf16 on one GPU: 16 GB / 0.5 GB/s = 33 s + 180 s → the 10-minute floor
    ("8B engine", source("engine", 1, 1, 16.06 * GB), 8, {"pvc": "models"}, 600),
    ("8B llmapi", source("llmapi", 1, 1, 16.06 * GB), 8, {"pvc": "models"}, 600),
    # Llama-3.1-70B tp 8, one node: 141 GB read by 8 ranks from one claim = 283 s + 180 s → the floor
    ("70B engine tp8", source("engine", 8, 1, 141.1 * GB), 8, {"pvc": "models"}, 600),
    # the same on the PyTorch backend: 283 s + 540 s (init, KV, CUDA graphs) = 823 s
    ("70B llmapi tp8", source("llmapi", 8, 1, 141.1 * GB), 8, {"pvc": "models"}, 830),
    # Llama-3.1-405B bf16 tp 8 x pp 2 on two nodes of 8: 810 GB from one claim = 1,620 s + 180 s + 600 s wait
    ("405B engine tp8 pp2", source("engine", 8, 2, 810 * GB), 8, {"pvc": "models"}, 2400),
    # each pod unpacks its own copy: 405 GB per pod = 810 s + 180 s + 600 s wait
    ("405B engine tp8 pp2 url", source("engine", 8, 2, 810 * GB), 8, {"artifact_url": "https://f.example/a.tar"},
     1590),
]


@pytest.mark.parametrize(("what", "src", "gpus", "delivery", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_the_budget_formula_against_the_peers(what, src, gpus, delivery, expected):
    from trtllm_kit.deploy.multinode import num_nodes

    settings = DeploySettings(gpus_per_node=gpus, image=IMAGE, **delivery)
    nodes = num_nodes(src, settings)
    budget = budgets(src, settings, nodes)
    assert budget.startup_s == expected
    assert budget.startup_s >= budget.wait_s + budget.read_s + get_target(src.target).startup_terms.total_s
    assert FLOOR_S <= budget.startup_s <= PEERS_S[1]
    assert budget.startup_failures * 10 == budget.startup_s


def test_load_gbps_is_shared_by_every_rank_of_the_volume():
    big = source("llmapi", 8, 1, 800 * GB)
    slow, fast = (budgets(big, DeploySettings(pvc="m", image=IMAGE, load_gbps=rate)) for rate in (0.5, 2.0))
    assert (slow.read_s, fast.read_s) == (1600, 400)  # all 800 GB through one volume, whatever the rank count
    assert slow.startup_s - fast.startup_s == 1200


def test_probe_and_ready_timeout_agree_and_check_refuses_a_shorter_probe(artifact, tmp_path, capsys):
    written = deploy(artifact(tp=8, rank_bytes=40 * GB), tmp_path / "k8s", capsys, "--pvc", "models")
    budget = written["startup_budget_s"]
    assert budget == 640 + 180  # 8 ranks x 40 GB from one claim at 0.5 GB/s, + 180 s
    deployment = objects(tmp_path / "k8s")["Deployment/llama-3-1-70b-instruct"]
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    probe = server["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == budget
    assert server["command"][server["command"].index("--ready-timeout") + 1] == str(budget)
    path = tmp_path / "k8s" / "deployment.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"] = 30
    path.write_text(yaml.safe_dump(doc))
    assert run(["deploy", "check", str(tmp_path / "k8s")]) == 1
    err = capsys.readouterr().err
    assert f"allows 300 s, less than the startup budget (trtllm-kit.io/startup-budget-s) of {budget} s" in err
    assert f"less than the server's --ready-timeout of {budget} s" in err


def group_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], artifact) -> tuple[LeaderPlan, dict]:
    """The plan and the leader's startupProbe that `deploy k8s` writes for 405B-sized tp 8 x pp 2 on 8-GPU nodes."""
    deploy(artifact(tp=8, pp=2, rank_bytes=50 * GB), tmp_path / "k8s", capsys, "--pvc", "models")
    found = objects(tmp_path / "k8s")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(found["ConfigMap/llama-3-1-70b-instruct-launch"]["data"]["plan.json"])
    lws = found["LeaderWorkerSet/llama-3-1-70b-instruct"]["spec"]["leaderWorkerTemplate"]
    return LeaderPlan.read(plan_path), lws["leaderTemplate"]["spec"]["containers"][0]["startupProbe"]


def test_a_leader_whose_workers_come_5_minutes_late_stays_within_its_probe(artifact, tmp_path, capsys):
    plan, probe = group_plan(tmp_path, capsys, artifact)
    allowed = probe["periodSeconds"] * probe["failureThreshold"]
    assert plan.startup_s == allowed and plan.worker_wait_s == 600  # one budget for the probe and the leader
    port = free_port()
    plan = LeaderPlan(**{**vars(plan), "ready_url": f"http://127.0.0.1:{port}/v2/health/ready"})
    clock = FakeClock()
    leader = Leader(plan, ["w-0-1.w.llm"], clock=clock, sleep=clock.sleep, probe=lambda _h, _p: clock.now >= 300)
    answered = leader.wait_for_workers()
    assert 300 <= answered < 300 + 5  # polled every 5 s
    script = tmp_path / "ranks.py"
    script.write_text(STAND_IN_RANKS)
    leader.start([sys.executable, str(script), str(port)])
    try:
        ready = leader.wait_ready()
    finally:
        assert leader.stop() == 0
    assert answered <= ready < allowed  # ready inside the probe's allowance
    budget_left = allowed - answered
    assert budget_left >= 1620 + 180  # the whole load still fits after the late workers (800 GB at 0.5 GB/s)


def test_a_leader_gives_up_on_missing_workers_before_its_probe(artifact, tmp_path, capsys):
    plan, probe = group_plan(tmp_path, capsys, artifact)
    clock = FakeClock()
    leader = Leader(plan, ["w-0-1.w.llm"], clock=clock, sleep=clock.sleep, probe=lambda _h, _p: False)
    with pytest.raises(KitError, match=r"1 of 1 workers did not answer on port 2222 within 600 s \(w-0-1.w.llm\)"):
        leader.wait_for_workers()
    assert 600 <= clock.now < probe["periodSeconds"] * probe["failureThreshold"]


def test_the_leader_exits_when_its_ranks_die_before_ready(tmp_path):
    plan = LeaderPlan(num_workers=0, slots=1, ranks=(), ready_url=f"http://127.0.0.1:{free_port()}/",
                      worker_wait_s=10, startup_s=600, exit_timeout_s=1, ssh_port=2222, ssh_key="k")
    clock = FakeClock()
    leader = Leader(plan, [], clock=clock, sleep=clock.sleep)
    leader.start([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(KitError, match="mpirun exited with 3 before rank 0 was ready"):
        leader.wait_ready()


def test_the_leaders_mpirun_reaches_the_workers_over_ssh(artifact, tmp_path, capsys):
    deploy(artifact(tp=8), tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "4",
           "--nccl-env", "NCCL_IB_HCA=mlx5", "--name", "llama70b", "--namespace", "llm")
    plan_text = objects(tmp_path / "k8s")["ConfigMap/llama70b-launch"]["data"]["plan.json"]
    (tmp_path / "plan.json").write_text(plan_text)
    plan = LeaderPlan.read(tmp_path / "plan.json")
    from trtllm_kit.deploy.leader import worker_hosts

    hosts = worker_hosts("llama70b-0.llama70b.llm", plan.num_workers)
    assert hosts == ["llama70b-0-1.llama70b.llm"]
    leader = Leader(plan, hosts)
    argv = leader.argv("/opt/hpcx/ompi/bin/mpirun", "/tmp/k")
    hosts_arg = f"{socket.gethostname()}:4,llama70b-0-1.llama70b.llm:4"
    assert argv[:3] == ["/opt/hpcx/ompi/bin/mpirun", "--host", hosts_arg]
    assert argv[3:7] == ["--mca", "plm_rsh_agent", "ssh", "--mca"]
    assert argv[8].startswith("-p 2222 -i /tmp/k -o StrictHostKeyChecking=no")
    assert argv[argv.index("NCCL_IB_HCA") - 1: argv.index("NCCL_IB_HCA") + 1] == ["-x", "NCCL_IB_HCA"]
    ranks = " ".join(argv[argv.index("NCCL_IB_HCA") + 1:]).split(" : ")
    assert len(ranks) == 8 and "--http-port=8000" in ranks[0] and "--allow-http=false" in ranks[7]
    restricted = next(a for a in ranks[0].split() if a.startswith("--http-restricted-api="))
    apis, _, token = restricted.partition("=")[2].partition(":trtllm-kit-token=")
    assert {"model-repository", "inference"} <= set(apis.split(",")) and token == leader.token  # drawn at start
    assert "@TRITON_TOKEN@" in plan_text and leader.token not in plan_text and len(leader.token) == 48
    assert Leader(plan, hosts).token != leader.token
    assert plan.frontend is not None and plan.frontend.text_model == "tensorrt_llm_bls" and plan.frontend.port == 9000
    assert json.loads(plan_text)["ssh_key"] == "/etc/trtllm-kit/ssh/id_ed25519"


def test_the_worker_script_is_valid_sh(tmp_path):
    from trtllm_kit.deploy.launch import WORKER_SCRIPT

    (tmp_path / "worker.sh").write_text(WORKER_SCRIPT)
    assert subprocess.run(["sh", "-n", str(tmp_path / "worker.sh")], timeout=30).returncode == 0


def test_check_refuses_a_leader_plan_its_probe_does_not_cover(artifact, tmp_path, capsys):
    deploy(artifact(tp=8), tmp_path / "k8s", capsys, "--pvc", "models", "--gpus-per-node", "4")
    assert run(["deploy", "check", str(tmp_path / "k8s")]) == 0
    capsys.readouterr()
    path = tmp_path / "k8s" / "launch-configmap.yaml"
    doc = yaml.safe_load(path.read_text())
    plan = json.loads(doc["data"]["plan.json"])
    probe_s = plan["startup_s"]
    plan.update(startup_s=probe_s + 600, worker_wait_s=probe_s + 600)
    doc["data"]["plan.json"] = json.dumps(plan)
    path.write_text(yaml.safe_dump(doc))
    assert run(["deploy", "check", str(tmp_path / "k8s")]) == 1
    err = capsys.readouterr().err
    assert f"the leader may take startup_s {probe_s + 600} s, but its startupProbe allows {probe_s} s" in err
    assert "leaves nothing of startup_s" in err


def test_deploy_leader_outside_a_group_says_so(tmp_path, capsys, monkeypatch):
    from trtllm_kit.deploy.leader_plan import LeaderPlan

    plan = LeaderPlan(num_workers=1, slots=4, ranks=("-n", "1", "true"), ready_url="http://127.0.0.1:1/",
                      worker_wait_s=10, startup_s=600, exit_timeout_s=1, ssh_port=2222, ssh_key="k")
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    monkeypatch.delenv("LWS_LEADER_ADDRESS", raising=False)
    assert run(["deploy", "leader", str(tmp_path / "plan.json")]) == 2
    assert "LWS_LEADER_ADDRESS is not set" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert run(["deploy", "leader", str(tmp_path / "bad.json")]) == 2
    assert "cannot be read" in capsys.readouterr().err
