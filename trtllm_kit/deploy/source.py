"""What a deployment needs to know about an artifact, read in one place: target, layout, load figures, files.

``read_source`` is the only function in ``deploy/`` that reads the manifest; every other module works on the
typed ``DeploySource``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtllm_kit.build.artifact import read_manifest
from trtllm_kit.errors import KitUsageError

TARGETS = ("engine", "cpu", "llmapi")
DEFAULT_MOUNT = "/artifact"


@dataclass(frozen=True)
class ArtifactFile:
    """One file of the artifact: its path relative to the artifact, sha256 and size (0 when not on this disk)."""

    path: str
    sha256: str
    num_bytes: int = 0


@dataclass(frozen=True)
class DeploySource:
    """The artifact as deployment sees it.

    ``mount_path`` is where the server must find the artifact: the repository's ``config.pbtxt`` names the
    engine or checkpoint directory by the absolute path it was built at, so the pod mounts it there.
    ``load_bytes`` is what the largest loading process reads before the server is ready (a rank's weights for
    engines, the whole checkpoint for the CPU runtime, which runs every rank in one process).
    """

    model: str
    target: str
    tp_size: int
    pp_size: int
    max_batch_size: int
    load_bytes: int
    mount_path: str
    files: tuple[ArtifactFile, ...]

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise KitUsageError(f"the artifact's target is {self.target!r}; deploy knows {', '.join(TARGETS)}.")
        if self.tp_size < 1 or self.pp_size < 1:
            raise KitUsageError(f"the artifact's layout is tp {self.tp_size} x pp {self.pp_size}; both must be >= 1.")

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def num_gpus(self) -> int:
        """GPUs one replica needs: one per rank, none for the CPU runtime."""
        return 0 if self.target == "cpu" else self.world_size

    @property
    def total_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)


def read_source(out: Path) -> DeploySource:
    """Read a build output's manifest (and its files' sizes) into a ``DeploySource``.

    Arguments:
        out: the ``trtllm-kit build`` output directory.
    """
    if not out.is_dir():
        raise KitUsageError(f"{out} is not a directory; pass a trtllm-kit build output (trtllm-kit build ... --out).")
    manifest = read_manifest(out)
    summary = manifest.get("summary") or {}
    repo = summary.get("repo") or {}
    if not repo:
        raise KitUsageError(f"{out} has no model repository in its manifest; build it with the repo stage "
                            f"(trtllm-kit build ... --out {out}).")
    engine = summary.get("engine") or {}
    checkpoint = summary.get("checkpoint") or {}
    target = repo.get("target") or engine.get("target") or "cpu"
    tp_size = int(engine.get("tp_size") or checkpoint.get("tp_size") or 1)
    pp_size = int(engine.get("pp_size") or checkpoint.get("pp_size") or 1)
    files = tuple(ArtifactFile(name, digest, _size(out / name)) for name, digest in
                  sorted((manifest.get("outputs") or {}).items()))
    plan = engine.get("plan") or {}
    rank_bytes = [int(r.get("weight_bytes", 0)) for r in plan.get("ranks") or ()]
    model_dir = str(repo.get("gpt_model_path") or "")
    if rank_bytes and target == "engine":
        load_bytes = max(rank_bytes)
    else:
        prefix = f"{PurePosixPath(model_dir).name or 'checkpoint'}/"
        load_bytes = sum(f.num_bytes for f in files if f.path.startswith(prefix))
    limits = repo.get("limits") or {}
    return DeploySource(
        model=str((summary.get("model") or {}).get("source") or out.name), target=target, tp_size=tp_size,
        pp_size=pp_size, max_batch_size=int(limits.get("max_batch_size") or plan.get("max_batch_size") or 1),
        load_bytes=load_bytes, mount_path=_mount_path(model_dir), files=files)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mount_path(model_dir: str) -> str:
    """The artifact root the repository expects: the parent of an absolute ``gpt_model_path``."""
    path = PurePosixPath(model_dir)
    return str(path.parent) if path.is_absolute() and str(path.parent) != "/" else DEFAULT_MOUNT
