"""The container command: the kit's launcher on one node, ``mpirun`` across a group's pods on several.

Every target serves its Triton repository with ``trtllm-kit serve`` (tritonserver per rank under ``mpirun`` when
the target runs a process per rank, the OpenAI frontend beside it). Only such a target (``process_per_rank``)
spans nodes: the leader waits for its group's pods, then starts every rank with ``mpirun`` over ``kubectl exec``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.serve.launcher import Endpoints, LaunchConfig, launch_argv
from trtllm_kit.serve.locate import TritonInstall

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
SCRIPTS_DIR = "/opt/trtllm-kit"  # the launch ConfigMap's mount
CONTAINER = "server"


def serve_command(source: DeploySource, settings: DeploySettings, ready_timeout_s: int) -> list[str]:
    """``trtllm-kit serve`` of the mounted artifact on every interface, with the deployment's timeouts.

    Arguments:
        source: the artifact; settings: the deployment; ready_timeout_s: the startup budget.
    """
    return ["trtllm-kit", "serve", source.mount_path, "--host", "0.0.0.0",
            *(arg for kind, port in PORTS.items() for arg in (f"--{kind}-port", str(port))),
            "--openai-port", str(settings.openai_port), "--tritonserver", TRITONSERVER,
            "--ready-timeout", str(ready_timeout_s), "--exit-timeout", str(settings.exit_timeout_s)]


def mpirun_ranks(source: DeploySource, settings: DeploySettings) -> list[str]:
    """Every rank's ``tritonserver`` command line after ``mpirun`` (``-n 1 … : -n 1 …``), from the kit's launcher.

    Arguments:
        source: the artifact; settings: the deployment.
    """
    install = TritonInstall(server=Path(TRITONSERVER), source="container")
    config = LaunchConfig(repo=Path(source.mount_path) / "repo", endpoints=Endpoints("0.0.0.0", *PORTS.values()),
                          world_size=source.world_size, exit_timeout_s=settings.exit_timeout_s)
    argv = launch_argv(install, config, is_root=False)
    assert argv[0] == "mpirun", "a multi-rank launch starts with mpirun"
    return argv[1:]


def leader_script(source: DeploySource, settings: DeploySettings, num_nodes: int) -> str:
    """The leader's entry point: wait until the group's pods run, then ``exec mpirun`` with one host per pod.

    Rank 0 lands on the leader (listed first), so the leader serves HTTP, gRPC and metrics. ``kubessh`` (next to
    this script) is mpirun's remote shell: ``kubectl exec`` into the worker pod, no sshd needed.

    Arguments:
        source: the artifact; settings: the deployment; num_nodes: pods in the group.
    """
    ranks = shlex.join(mpirun_ranks(source, settings))
    return f"""#!/bin/sh
# Start {source.world_size} tritonserver ranks across the {num_nodes} pods of this LeaderWorkerSet group.
set -eu
deadline=$(( $(date +%s) + ${{WORKER_WAIT_S:-600}} ))
while :; do
  workers=$(kubectl get pods -n "$POD_NAMESPACE" \\
    -l "leaderworkerset.sigs.k8s.io/group-key=$GROUP_KEY,role=worker" --field-selector status.phase=Running \\
    -o jsonpath='{{range .items[*]}}{{.metadata.name}}{{"\\n"}}{{end}}')
  found=$(printf '%s\\n' "$workers" | grep -c . || true)
  [ "$found" -ge {num_nodes - 1} ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "only $found of {num_nodes - 1} workers of group $GROUP_KEY run; check their events" >&2
    exit 1
  fi
  sleep 5
done
hosts="$POD_NAME:{settings.gpus_per_node}"
for worker in $workers; do hosts="$hosts,$worker:{settings.gpus_per_node}"; done
exec mpirun --host "$hosts" --mca plm_rsh_agent {SCRIPTS_DIR}/kubessh {ranks}
"""


KUBESSH = f"""#!/bin/sh
# mpirun's remote shell inside a LeaderWorkerSet group: run the command in pod $1's server container.
pod="$1"; shift
exec kubectl exec -i -n "$POD_NAMESPACE" "$pod" -c {CONTAINER} -- /bin/sh -c "$*"
"""
WORKER_COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 1; done"]
