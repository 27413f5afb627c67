"""The multi-node leader (``trtllm-kit deploy leader PLAN``): wait for the group's workers, start every rank with
``mpirun`` over ssh, wait for rank 0 to be ready, serve, and stop the ranks on SIGTERM.

Everything it needs is in the image: Open MPI's ``mpirun`` reaches the workers with ``ssh`` (each worker runs
``sshd`` on ``ssh_port``, keyed by the group's Secret), no Kubernetes API access is used. The workers' names come
from the LeaderWorkerSet's environment (``LWS_LEADER_ADDRESS`` = ``<leader pod>.<subdomain>.<namespace>``, worker
``i`` is ``<leader pod>-<i>.<subdomain>.<namespace>``).

Its deadlines are the pod's: the wait for workers ends at ``worker_wait_s`` and readiness at ``startup_s``, both
counted from its own start, so the startupProbe (which allows ``startup_s``) never fires first while the leader
still waits. On the engine target the kit's OpenAI frontend then serves beside rank 0 (its Triton on loopback);
on the llmapi target rank 0 is ``trtllm-serve``, itself the OpenAI server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.deploy.leader_plan import TOKEN_SLOT, LeaderPlan
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.http_probe import answers

POLL_S = 5.0
def worker_hosts(leader_address: str, num_workers: int) -> list[str]:
    """The workers' DNS names from the leader's (``name-0.sub.ns`` → ``name-0-1.sub.ns``, ...).

    Arguments:
        leader_address: ``LWS_LEADER_ADDRESS``; num_workers: pods in the group besides the leader.
    """
    pod, dot, domain = leader_address.partition(".")
    return [f"{pod}-{index}{dot}{domain}" for index in range(1, num_workers + 1)]


def reachable(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection now (a worker's sshd is up)."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


@dataclass
class Leader:
    """One leader run: its plan, its clock and its ranks' process.

    Arguments:
        plan: the plan; hosts: the workers' names; clock, sleep, probe: time and the worker check (stand-ins
        in tests).
    """

    plan: LeaderPlan
    hosts: list[str]
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    probe: Callable[[str, int], bool] = reachable
    started: float = 0.0
    process: subprocess.Popen[bytes] | None = None
    token: str = field(default_factory=lambda: secrets.token_hex(24), repr=False)  # Triton's, for this run only

    def __post_init__(self) -> None:
        self.started = self.clock()

    def wait_for_workers(self) -> float:
        """Seconds since the start when every worker answered; raises ``KitError`` at ``worker_wait_s``."""
        deadline = self.started + self.plan.worker_wait_s
        waiting = list(self.hosts)
        while True:
            waiting = [host for host in waiting if not self.probe(host, self.plan.ssh_port)]
            if not waiting:
                return self.clock() - self.started
            if self.clock() >= deadline:
                raise KitError(f"{len(waiting)} of {len(self.hosts)} workers did not answer on port "
                               f"{self.plan.ssh_port} within {self.plan.worker_wait_s} s ({', '.join(waiting)}); "
                               "check their pods' events and the fetch-artifact logs.")
            self.sleep(POLL_S)

    def argv(self, mpirun: str, key: str) -> list[str]:
        """The whole ``mpirun`` command: the group's hosts (leader first: rank 0 is here), ssh, the ranks.

        Arguments:
            mpirun: the absolute ``mpirun`` (so remote daemons find Open MPI under the same prefix); key: the
            private key file.
        """
        hosts = ",".join(f"{host}:{self.plan.slots}" for host in [socket.gethostname(), *self.hosts])
        ssh = (f"-p {self.plan.ssh_port} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
               "-o LogLevel=ERROR -o BatchMode=yes")
        forward = [arg for name in ("PATH", "LD_LIBRARY_PATH", *self.plan.forward_env) for arg in ("-x", name)]
        return [mpirun, "--host", hosts, "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", ssh,
                "--mca", "orte_keep_fqdn_hostnames", "1", *forward,
                *(rank.replace(TOKEN_SLOT, self.token) for rank in self.plan.ranks)]

    def start(self, argv: list[str]) -> None:
        """Start the ranks in their own process group (SIGTERM reaches mpirun, which stops every rank)."""
        self.process = subprocess.Popen(argv, start_new_session=True)

    def wait_ready(self) -> float:
        """Seconds since the start when rank 0 answered ``ready_url``; raises ``KitError`` at ``startup_s``."""
        assert self.process is not None, "start the ranks first"
        deadline = self.started + self.plan.startup_s
        while True:
            if self.process.poll() is not None:
                raise KitError(f"mpirun exited with {self.process.returncode} before rank 0 was ready; its output "
                               "above names the rank that failed.")
            if answers(self.plan.ready_url, timeout_s=2):
                return self.clock() - self.started
            if self.clock() >= deadline:
                raise KitError(f"rank 0 was not ready at {self.plan.ready_url} within the startup budget of "
                               f"{self.plan.startup_s} s; raise load_gbps's estimate or worker_wait_s.")
            self.sleep(1.0)

    def stop(self) -> int:
        """SIGTERM to the ranks; SIGKILL after their exit timeout and 5 s; their exit code."""
        assert self.process is not None, "start the ranks first"
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(self.plan.exit_timeout_s + 5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def private_key_copy(key: Path) -> Path:
    """The key copied to a private file (ssh refuses a key others may read; Secret volumes add group read)."""
    copy = Path(tempfile.mkdtemp(prefix="trtllm-kit-ssh-")) / key.name
    copy.write_bytes(key.read_bytes())
    copy.chmod(0o600)
    return copy


async def _serve(leader: Leader) -> None:
    """Run the frontend (when planned) until SIGTERM/SIGINT or until the ranks exit."""
    assert leader.process is not None, "start the ranks first"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = None
    if leader.plan.frontend is not None:
        from trtllm_kit.deploy.leader_frontend import start

        runner = await start(leader.plan.frontend, leader.token)
    try:
        while not stop.is_set() and leader.process.poll() is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        if runner is not None:
            await runner.cleanup()


def run_leader(plan: LeaderPlan, environ: dict[str, str]) -> int:
    """The leader's whole run; its exit code (non-zero when the ranks failed, which recreates the group).

    Arguments:
        plan: the plan; environ: the pod's environment (``LWS_LEADER_ADDRESS``).
    """
    address = environ.get("LWS_LEADER_ADDRESS")
    if not address:
        raise KitUsageError("LWS_LEADER_ADDRESS is not set; trtllm-kit deploy leader runs in a LeaderWorkerSet's "
                            "leader pod.")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise KitError("mpirun is not on PATH in this image; build the image from docker/Dockerfile.")
    leader = Leader(plan, worker_hosts(address, plan.num_workers))
    waited = leader.wait_for_workers()
    print(f"trtllm-kit leader: {plan.num_workers} worker(s) answered after {waited:.0f} s", flush=True)
    leader.start(leader.argv(os.path.abspath(mpirun), str(private_key_copy(Path(plan.ssh_key)))))
    try:
        ready = leader.wait_ready()
        print(f"trtllm-kit leader: rank 0 ready after {ready:.0f} s of {plan.startup_s} s", flush=True)
        asyncio.run(_serve(leader))
    finally:
        code = leader.stop()
    return 0 if code in (0, -signal.SIGTERM) else 1
