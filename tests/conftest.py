"""Test isolation: the kit's cache and the HF cache point into a per-session temporary directory, whose models and
bytecode the workers share; the session's builds and the servers modules share (``kit_server.py``)."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures: a module that serves nothing does not import the serving stack
    from kit_server import Builds, Servers

# One OpenMP thread per process, set before anything imports torch, for the workers pytest-xdist starts and every
# process a test starts (builds, servers, their Python stubs): the suite runs as many workers as the machine has
# cores, and a process's operations each wait at OpenMP's barrier for a second thread the other processes hold.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Idle OpenMP threads sleep rather than spin: a test that runs torch at 2 threads (the AWQ oracles, whose bits need
# 2) otherwise spends its time spinning at each operation's barrier while the other worker holds the cores.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


# Folders of the kit's cache that the session's workers share: models written once (the built-in models, the real
# model's package and its GGUF import, each written into place by a rename, ``models/cache_dir.py``) and the bytecode
# of the processes servers start. Each worker keeps the rest: its serves' run states (which ``stop`` and ``status``
# list), the verify references and calibrations (which tests see computed or taken), the timing cache.
SHARED_CACHE_FOLDERS = ("builtin", "packages", "gguf", "pycache")


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built-in models are generated once per session under a temporary cache; nothing touches ~/.cache."""
    root = tmp_path_factory.mktemp("caches")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the session's directory holds each worker's
        shared = tmp_path_factory.getbasetemp().parent / "shared-cache"
        (root / "trtllm-kit").mkdir()
        for name in SHARED_CACHE_FOLDERS:
            (shared / name).mkdir(parents=True, exist_ok=True)
            (root / "trtllm-kit" / name).symlink_to(shared / name, target_is_directory=True)
    saved = {k: os.environ.get(k) for k in ("TRTLLM_KIT_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")}
    os.environ["TRTLLM_KIT_CACHE"] = str(root / "trtllm-kit")
    os.environ["HF_HOME"] = str(root / "hf")
    os.environ.pop("HF_HUB_CACHE", None)
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def kit_builds(isolated_caches: Path, tmp_path_factory: pytest.TempPathFactory) -> Builds:
    """Build outputs made once per session, keyed by what they are built of."""
    from kit_server import Builds

    return Builds(tmp_path_factory.mktemp("builds"))


@pytest.fixture(scope="session")
def kit_servers(kit_builds: Builds) -> Iterator[Servers]:
    """Servers of the session's builds, one per build and serve settings, shared by every module that asks."""
    from kit_server import Servers

    servers = Servers(kit_builds)
    yield servers
    servers.stop_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a test marked ``slow`` run first, each module's tests in their order: the README's command hands
    modules to its two workers in this order (``--dist loadfile --no-loadscope-reorder``), so the long ones start
    early and the run ends on short ones, not on one worker finishing a long module alone."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)  # stable: the order within each part is kept


def pytest_unconfigure(config: pytest.Config) -> None:
    """The summary line is the run's last: OpenAI Triton's compiler module (torch._dynamo imports it where xgrammar
    installed it) lists its live objects on stderr when the interpreter ends, after pytest has given its stderr
    back; an exit function, which runs after that, sends what remains to /dev/null."""
    atexit.register(_quiet_end)


def _quiet_end() -> None:
    if "triton._C.libtriton" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
