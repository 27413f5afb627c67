"""What a deployment needs to know about an artifact, read in one place: target, layout, load figures, files.

``read_source`` is the only function in ``deploy/`` that reads the manifest; every other module works on the
typed ``DeploySource``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtllm_kit.artifact import Artifact, EngineRecord
from trtllm_kit.errors import KitUsageError
from trtllm_kit.mapping import Mapping
from trtllm_kit.targets import TARGETS, get_target

DEFAULT_MOUNT = "/artifact"
OPTIONS_FLAG = "--extra_llm_api_options"


@dataclass(frozen=True)
class ArtifactFile:
    """One file of the artifact: its path relative to the artifact, sha256 and size (on this disk, else as the
    manifest recorded it when the build wrote it)."""

    path: str
    sha256: str
    num_bytes: int = 0


@dataclass(frozen=True)
class DeploySource:
    """The artifact as deployment sees it.

    ``mount_path`` is where the server must find the artifact: the repository's ``config.pbtxt`` names the
    engine or checkpoint directory by the absolute path it was built at, so the pod mounts it there.
    ``load_bytes`` is what a replica reads before it is ready: every rank's engine weights, or the checkpoint.
    ``gpu``, ``compute_capability`` and ``tensorrt_llm`` are the engine build's (engines run only on the GPU and
    runtime they were built with; None for checkpoints); ``quant_algos`` are the checkpoint's quantization
    algorithms (weights and KV cache). ``serve_command`` is the ``trtllm-serve`` command an llmapi build records
    and ``serve_options`` the text of its ``--extra_llm_api_options`` file (None for other targets).
    """

    model: str
    target: str
    tp_size: int
    pp_size: int
    max_batch_size: int
    load_bytes: int
    mount_path: str
    files: tuple[ArtifactFile, ...]
    gpu: str | None = None
    compute_capability: str | None = None
    tensorrt_llm: str | None = None
    quant_algos: tuple[str, ...] = ()
    serve_command: tuple[str, ...] = ()
    serve_options: str | None = None
    tokens_per_block: int | None = None  # the KV cache block, when the repository records it

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
    sizes = _sizes(out, artifact)
    files = tuple(ArtifactFile(name, digest, sizes[name]) for name, digest in sorted(artifact.files.items()))
    plan = engine.plan if engine else None
    built = engine.built if engine else None
    rank_bytes = [r.weight_bytes for r in plan.ranks] if plan else []
    if rank_bytes and get_target(artifact.target).process_per_rank:
        load_bytes = sum(rank_bytes)
    else:
        prefix = f"{PurePosixPath(repo.gpt_model_path).name or 'checkpoint'}/"
        load_bytes = sum(f.num_bytes for f in files if f.path.startswith(prefix))
    return DeploySource(
        model=artifact.model_source, target=artifact.target, tp_size=artifact.layout.tp_size,
        pp_size=artifact.layout.pp_size,
        max_batch_size=repo.limits.max_batch_size,
        load_bytes=load_bytes, mount_path=_mount_path(repo.gpt_model_path), files=files,
        gpu=built.gpu if built else None, compute_capability=built.compute_capability if built else None,
        tensorrt_llm=built.tensorrt_llm if built else None, quant_algos=_quant_algos(artifact),
        serve_command=tuple(engine.command or ()) if engine else (), serve_options=_serve_options(out, engine),
        tokens_per_block=repo.limits.tokens_per_block)


def _sizes(out: Path, artifact: Artifact) -> dict[str, int]:
    """Every artifact file's size: on this disk, else as the manifest recorded it; refused when neither is known,
    since the storage limits and the startup budget are computed from the sizes.

    Arguments:
        out: the build output; artifact: its manifest (files, and ``[size, mtime_ns]`` by file when recorded).
    """
    sizes, missing = {}, []
    for name in sorted(artifact.files):
        try:
            sizes[name] = (out / name).stat().st_size
        except OSError:
            stats = artifact.file_stats.get(name) or []
            if stats and isinstance(stats[0], int):
                sizes[name] = stats[0]
            else:
                missing.append(name)
    if missing:
        raise KitUsageError(f"{len(missing)} of {len(artifact.files)} artifact files are not in {out} and the "
                            f"manifest records no size for them (the first: {missing[0]}), so the storage limit "
                            "and the startup budget cannot be computed; run deploy on the complete build output.")
    return sizes


def _mount_path(model_dir: str) -> str:
    """The artifact root the repository expects: the parent of an absolute ``gpt_model_path``."""
    path = PurePosixPath(model_dir)
    return str(path.parent) if path.is_absolute() and str(path.parent) != "/" else DEFAULT_MOUNT


def _quant_algos(artifact: Artifact) -> tuple[str, ...]:
    """The checkpoint's quantization algorithms (``FP8``, ...), weights and KV cache, upper-case."""
    checkpoint = artifact.records.checkpoint
    block = (checkpoint.quantization if checkpoint else None) or {}
    return tuple(str(block[key]).upper() for key in ("quant_algo", "kv_cache_quant_algo") if block.get(key))


def _serve_options(out: Path, engine: EngineRecord | None) -> str | None:
    """The text of the recorded ``trtllm-serve`` command's ``--extra_llm_api_options`` file, read from ``out``."""
    command = list(engine.command or ()) if engine else []
    if OPTIONS_FLAG not in command[:-1]:
        return None
    recorded = PurePosixPath(command[command.index(OPTIONS_FLAG) + 1])
    path = out / recorded.parent.name / recorded.name
    return path.read_text() if path.is_file() else None
