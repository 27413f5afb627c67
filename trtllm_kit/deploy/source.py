"""What a deployment needs to know about an artifact, read in one place: target, layout, load figures, files.

``read_source`` is the only function in ``deploy/`` that reads the manifest; every other module works on the
typed ``DeploySource``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtllm_kit.artifact import Artifact
from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import Mapping
from trtllm_kit.targets import TARGETS, get_target

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
        return Mapping(self.tp_size, self.pp_size).world_size

    @property
    def num_gpus(self) -> int:
        """GPUs one replica needs: one per rank, none for the CPU runtime."""
        return self.world_size if get_target(self.target).uses_gpus else 0

    @property
    def total_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)


def read_source(out: Path) -> DeploySource:
    """Read a build output's artifact (and its files' sizes) into a ``DeploySource``.

    Arguments:
        out: the ``trtllm-kit build`` output directory.
    """
    artifact = Artifact.read(out)
    repo, engine = artifact.records.repo, artifact.records.engine
    if repo is None:
        raise KitUsageError(f"{out} has no model repository in its manifest; build it with the repo stage "
                            f"(trtllm-kit build ... --out {out}).")
    files = tuple(ArtifactFile(name, digest, _size(out / name)) for name, digest in sorted(artifact.files.items()))
    plan = engine.plan if engine else None
    rank_bytes = [r.weight_bytes for r in plan.ranks] if plan else []
    if rank_bytes and get_target(artifact.target).process_per_rank:
        load_bytes = max(rank_bytes)
    else:
        prefix = f"{PurePosixPath(repo.gpt_model_path).name or 'checkpoint'}/"
        load_bytes = sum(f.num_bytes for f in files if f.path.startswith(prefix))
    return DeploySource(
        model=artifact.model_source, target=artifact.target, tp_size=artifact.layout.tp_size,
        pp_size=artifact.layout.pp_size,
        max_batch_size=repo.limits.max_batch_size,
        load_bytes=load_bytes, mount_path=_mount_path(repo.gpt_model_path), files=files)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mount_path(model_dir: str) -> str:
    """The artifact root the repository expects: the parent of an absolute ``gpt_model_path``."""
    path = PurePosixPath(model_dir)
    return str(path.parent) if path.is_absolute() and str(path.parent) != "/" else DEFAULT_MOUNT
