"""What serving a build's output needs, checked against this machine before anything is started."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.repository import python_source
from trtllm_kit.names import TRTLLM_MODEL
from trtllm_kit.targets import Target, get_target

# The text models in order of preference: BLS streams in order; the ensemble's responses may overtake each other
# when postprocessing runs several instances.
TEXT_MODELS = ("tensorrt_llm_bls", "ensemble")


@dataclass(frozen=True)
class Servable:
    """A build output ready to launch: its artifact, repository, target, launch world size and tokenizer."""

    artifact: Artifact
    target: Target
    world_size: int  # server processes the launch starts (MPI ranks)
    tokenizer_dir: Path | None
    models: tuple[str, ...]  # the public text models the repository holds

    @property
    def out(self) -> Path:
        return self.artifact.path

    @property
    def repo(self) -> Path:
        return self.artifact.path / "repo"


def servable(out: Path, machine: Machine | None = None) -> Servable:
    """Read ``OUT``'s artifact and refuse what its target cannot serve here (TRT-LLM version, GPU, world size).

    Arguments:
        out: the build's output directory.
        machine: this machine's toolchain and GPUs (detected when omitted and the target needs it).
    """
    artifact = Artifact.read(out)
    repo = out / "repo"
    target = get_target(artifact.target)
    models = tuple(name for name in target.text_models if (repo / name / "config.pbtxt").is_file())
    if not models:
        raise KitUsageError(f"{repo} holds no {' or '.join(target.text_models)} model; rebuild with the repo stage "
                            f"(trtllm-kit build ... --out {out}).")
    problems = target.serve_problems(artifact, machine)
    stale = _slot_model_problem(repo, target)
    if stale:
        problems = [*problems, stale]
    if problems:
        raise KitUsageError(f"{out} cannot be served here: {'; '.join(problems)}; rebuild it on this machine "
                            f"(trtllm-kit build ... --out {out} --force) or serve it where it was built.")
    tokenizer = out / "tokenizer"
    return Servable(artifact=artifact, target=target, world_size=target.launch_world_size(artifact),
                    tokenizer_dir=tokenizer if tokenizer.is_dir() else None, models=models)


def _slot_model_problem(repo: Path, target: Target) -> str | None:
    """Why the repository's ``tensorrt_llm`` Python model cannot run with this kit, or None.

    The kit's slot models import the installed kit's runtime, so a repository written by another trtllm-kit may
    call what this one no longer has: its ``model.py`` must be this kit's file, byte for byte.
    """
    shipped = repo / TRTLLM_MODEL / "1" / "model.py"
    if target.slot_model is None or not shipped.is_file():  # a C++ backend, or no slot model to run
        return None
    if shipped.read_bytes() != python_source(target.slot_model).read_bytes():
        return (f"its {TRTLLM_MODEL} model ({shipped}) was written by another trtllm-kit than this one "
                f"and may not run with it")
    return None
