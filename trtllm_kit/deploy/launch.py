"""The container command: the kit's launcher on one node, ``mpirun`` across a group's pods on several.

Each target is one ``TargetLaunch`` entry. ``engine`` and ``cpu`` serve the Triton repository with
``trtllm-kit serve`` (tritonserver per rank under ``mpirun`` when tp x pp > 1, the OpenAI frontend beside it);
``llmapi`` runs tensor parallelism inside one process on one node, and across nodes upstream's
``trtllm-llmapi-launch trtllm-serve`` on every rank. Across nodes the leader runs
``trtllm-kit deploy leader`` with the plan written here (``deploy/leader.py``): it waits for the workers' sshd,
starts every rank with ``mpirun`` over ssh, and (Triton) serves the OpenAI API beside rank 0; workers run
``sshd`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

import yaml

from trtllm_kit.deploy import gateway
from trtllm_kit.deploy.leader_plan import TOKEN_SLOT, FrontendPlan, LeaderPlan
from trtllm_kit.deploy.serving import TRITON, serving_for
from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import OPTIONS_FLAG, DeploySource
from trtllm_kit.enums import GroupLaunch
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.options import Endpoints
from trtllm_kit.serve.server.launcher import LaunchConfig, launch_argv
from trtllm_kit.serve.server.locate import TritonInstall
from trtllm_kit.targets import get_target

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
SCRIPTS_DIR = "/opt/trtllm-kit"  # the launch ConfigMap's mount
PLAN_FILE = "plan.json"
LAUNCH_SUFFIX = "-launch"  # the launch ConfigMap is <name>-launch
OPTIONS_FILE = "llm_api_options.yaml"  # an llmapi group's --extra_llm_api_options
SSH_DIR = "/etc/trtllm-kit/ssh"  # the group's key pair (a Secret)
SSH_KEY = "id_ed25519"
SSH_PORT = 2222
CONTAINER = "server"


def serve_command(source: DeploySource, settings: DeploySettings, ready_timeout_s: int) -> list[str]:
    """``trtllm-kit serve`` of the mounted artifact on every interface, with the deployment's timeouts.

    Arguments:
        source: the artifact; settings: the deployment; ready_timeout_s: the startup budget.
    """
    return ["trtllm-kit", "serve", source.mount_path, "--host", "0.0.0.0",
            *(arg for kind, port in PORTS.items() for arg in (f"--{kind}-port", str(port))),
            "--openai-port", str(settings.openai_port), "--tritonserver", TRITONSERVER,
            "--ready-timeout", str(ready_timeout_s), "--exit-timeout", str(settings.exit_timeout_s),
            *gateway.serve_args(settings)]


def mpirun_ranks(source: DeploySource, settings: DeploySettings) -> list[str]:
    """Every rank's ``tritonserver`` command line after ``mpirun`` (``-n 1 … : -n 1 …``), from the kit's launcher;
    every API of rank 0 but health demands a token (``TOKEN_SLOT`` here, drawn by the leader at start), which only
    the leader's frontend holds.

    Arguments:
        source: the artifact; settings: the deployment.
    """
    install = TritonInstall(server=Path(TRITONSERVER), source="container")
    config = LaunchConfig(repo=Path(source.mount_path) / "repo", endpoints=Endpoints("0.0.0.0", *PORTS.values()),
                          world_size=source.world_size, exit_timeout_s=settings.exit_timeout_s,
                          restricted_token=TOKEN_SLOT, restrict_inference=True)
    argv = launch_argv(install, config, is_root=False)
    assert argv[0] == "mpirun", "a multi-rank launch starts with mpirun"
    return argv[1:]


def llmapi_ranks(source: DeploySource, settings: DeploySettings) -> list[str]:
    """Upstream's multi-node launch of the PyTorch backend after ``mpirun``: every rank runs
    ``trtllm-llmapi-launch trtllm-serve CHECKPOINT`` (TensorRT-LLM ``examples/llm-api/llm_mgmn_trtllm_serve.sh``);
    rank 0 serves the OpenAI API, the others join its LLM. The recorded command, re-rooted at the mount, on every
    interface and the OpenAI port, with the options the launch ConfigMap holds.

    Arguments:
        source: the artifact (its recorded trtllm-serve command); settings: the OpenAI port.
    """
    if not source.serve_command or source.serve_command[0] != "trtllm-serve":
        raise KitUsageError("the llmapi artifact records no trtllm-serve command, which a multi-node group runs; "
                            "rebuild it with trtllm-kit build --target llmapi.")
    argv = list(source.serve_command)
    argv[1] = f"{source.mount_path}/{PurePosixPath(argv[1]).name}"
    values = {"--host": "0.0.0.0", "--port": str(settings.openai_port), OPTIONS_FLAG: f"{SCRIPTS_DIR}/{OPTIONS_FILE}",
              "--tp_size": str(source.tp_size), "--pp_size": str(source.pp_size)}
    for flag, value in values.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return ["-n", str(source.world_size), "trtllm-llmapi-launch", *argv]


def llmapi_options(source: DeploySource) -> str:
    """The recorded ``--extra_llm_api_options`` with ``return_perf_metrics`` on (``/prometheus/metrics``)."""
    options = yaml.safe_load(source.serve_options or "") or {}
    return yaml.safe_dump({**options, "return_perf_metrics": True}, sort_keys=False)


def leader_plan(source: DeploySource, settings: DeploySettings, num_nodes: int, startup_s: int) -> LeaderPlan:
    """The multi-node leader's plan: the group, the ranks, its deadlines, ssh, and the frontend beside rank 0
    (none when rank 0 is ``trtllm-serve``, itself the OpenAI server).

    Arguments:
        source: the artifact; settings: the deployment; num_nodes: pods in the group; startup_s: the budget.
    """
    group_launch = get_target(source.target).group_launch
    assert group_launch is not None, f"target {source.target} runs in one pod, so it never spans nodes"
    serving = serving_for(source, settings, num_nodes)
    port = settings.openai_port if serving.health_port == "openai" else PORTS[serving.health_port]
    frontend = None
    if serving is TRITON:
        present = {f.path for f in source.files}
        text_model = next(m for m in get_target(source.target).text_models if f"repo/{m}/config.pbtxt" in present)
        keyed = settings.api_keys_secret is not None
        frontend = FrontendPlan(out=source.mount_path, served_name=source.model, text_model=text_model,
                                port=settings.openai_port, api_keys=gateway.KEYS_PATH if keyed else None,
                                usage_log=gateway.USAGE_LOG if keyed else None)
    elif settings.api_keys_secret is not None:
        raise KitUsageError("--api-keys-secret needs the kit's OpenAI gateway, but an llmapi artifact across nodes "
                            "is served by trtllm-serve; put an API gateway in front of the Service instead, or "
                            "use nodes that hold every rank.")
    return LeaderPlan(num_workers=num_nodes - 1, slots=settings.gpus_per_node,
                      ranks=tuple(GROUP_RANKS[group_launch](source, settings)),
                      ready_url=f"http://127.0.0.1:{port}{serving.ready_path}",
                      worker_wait_s=settings.worker_wait_s, startup_s=startup_s,
                      exit_timeout_s=settings.exit_timeout_s, ssh_port=SSH_PORT, ssh_key=f"{SSH_DIR}/{SSH_KEY}",
                      forward_env=tuple(settings.nccl_env), frontend=frontend)


LEADER_COMMAND = ["trtllm-kit", "deploy", "leader", f"{SCRIPTS_DIR}/{PLAN_FILE}"]
WORKER_SCRIPT = f"""#!/bin/sh
# A worker of a LeaderWorkerSet group: sshd on port {SSH_PORT} as this user, for the leader's mpirun only (the
# group's public key, no passwords); it runs until the pod stops.
set -eu
dir=$(mktemp -d /tmp/trtllm-kit-sshd.XXXXXX)
ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
cat > "$dir/sshd_config" <<EOF
Port {SSH_PORT}
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile {SSH_DIR}/{SSH_KEY}.pub
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
AllowTcpForwarding no
X11Forwarding no
EOF
exec /usr/sbin/sshd -D -e -f "$dir/sshd_config"
"""
WORKER_COMMAND = ["/bin/sh", f"{SCRIPTS_DIR}/worker.sh"]


# mpirun's rank part of each way a target starts its ranks across a group's pods
GROUP_RANKS: dict[GroupLaunch, Callable[[DeploySource, DeploySettings], list[str]]] = {
    GroupLaunch.TRITON_RANKS: mpirun_ranks,
    GroupLaunch.LLMAPI_LAUNCH: llmapi_ranks,
}
