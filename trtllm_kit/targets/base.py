"""What a serving target is: one object that owns every decision the build, the repository and serve make
differently per target (machine check, compile step, limits, repository models, validation, launch)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trtllm_kit.errors import KitUsageError

if TYPE_CHECKING:
    from trtllm_kit.artifact import Artifact, EngineRecord, RepoRecord
    from trtllm_kit.build.compat import Machine
    from trtllm_kit.build.engine import EngineSetup
    from trtllm_kit.build.pipeline import BuildContext
    from trtllm_kit.model_repo.limits import EngineLimits
    from trtllm_kit.serve.launcher import LaunchConfig
    from trtllm_kit.serve.locate import TritonInstall
    from trtllm_kit.spec import BuildSpec


class Target(ABC):
    """A serving target. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]
    summary: ClassVar[str]            # one line for --help and the plan
    model_dir: ClassVar[str]          # the artifact directory gpt_model_path names (engines/, checkpoint/)
    rank_file_pattern: ClassVar[str]  # one file per rank in model_dir
    backend: ClassVar[str]            # the Triton backend of the tensorrt_llm slot
    slot_model: ClassVar[str | None]  # the kit's Python model file for that slot (None: a C++ backend)
    compiles: ClassVar[bool]          # whether the compile stage produces files (else it records what it would run)
    # the public models a client sends text to, in order of preference (the engine-target repository's)
    text_models: ClassVar[tuple[str, ...]] = ("tensorrt_llm_bls", "ensemble")
    owns_checkpoint: ClassVar[bool] = False  # writes its own checkpoint/ (so --until checkpoint still asks it)

    def check_spec(self, spec: BuildSpec) -> None:
        """Refuse, before any heavy work, a spec this target cannot build (default: every spec is fine).

        Arguments:
            spec: the build spec.
        """
        from trtllm_kit.build.inspect import resolve_model_path
        from trtllm_kit.quant.algos import check_target
        from trtllm_kit.quant.prequantized import detect_prequantized

        check_target(spec.quant_config(), self.name)
        fmt = detect_prequantized(resolve_model_path(spec.model))
        if fmt is not None:
            raise KitUsageError(f"{spec.model} is a pre-quantized {fmt.label} checkpoint ({fmt.declared_in}); the "
                                f"{self.name} target converts unquantized weights only and would have to de- and "
                                "re-quantize these: build it with --target llmapi, which serves it as it is, or "
                                "start from the unquantized model with --quant fp8.")
        if spec.repo.gpu_device_ids is not None:
            raise KitUsageError(f"--gpu-device-ids applies to --target llmapi only (one LLM per GPU group); the "
                                f"{self.name} target's repository runs one tensorrt_llm instance, so drop the option "
                                "or build with --target llmapi.")

    def write_checkpoint(self, ctx: BuildContext) -> None:
        """The checkpoint stage: ``checkpoint/`` and ``tokenizer/`` (default: the TensorRT-LLM checkpoint)."""
        from trtllm_kit.build.pipeline import trtllm_checkpoint_stage

        trtllm_checkpoint_stage(ctx)

    def write_repo(self, ctx: BuildContext) -> RepoRecord | None:
        """The repo stage for a target with its own repository layout; None: the standard five models."""
        return None

    @abstractmethod
    def machine_problem(self, machine: Machine) -> str | None:
        """Why this target cannot be built here (one sentence), or None. A plan skips this check."""

    @abstractmethod
    def chosen_because(self, machine: Machine) -> str:
        """Why this target runs here, for the build's notes (called when ``machine_problem`` is None)."""

    @abstractmethod
    def compile(self, ctx: BuildContext, setup: EngineSetup) -> EngineRecord:
        """The compile stage over ``ctx.out/checkpoint``; returns its record for the manifest."""

    @abstractmethod
    def reads_model_dir(self, config: dict[str, Any]) -> bool:
        """Whether a ``config.json`` under ``gpt_model_path`` is this target's model directory."""

    @abstractmethod
    def limits(self, model_dir: Path, overrides: dict[str, int | None]) -> EngineLimits:
        """What the ``tensorrt_llm`` slot can run over ``model_dir``.

        Arguments:
            model_dir: the directory gpt_model_path names; overrides: runtime sizes chosen by the user
            (``max_batch_size``, ``max_num_tokens``, ``max_seq_len``, ``tokens_per_block``; None: default).
        """

    def serve_problems(self, artifact: Artifact, machine: Machine | None) -> list[str]:
        """What keeps ``artifact`` from being served here; empty when it can be.

        Arguments:
            artifact: the artifact; machine: this machine (detected when None and the target needs it).
        """
        return []

    def launch_world_size(self, artifact: Artifact) -> int:
        """How many server processes (MPI ranks) the launch starts."""
        return 1

    def argv(self, install: TritonInstall, config: LaunchConfig, *, mpirun: str = "mpirun",
             is_root: bool | None = None) -> list[str]:
        """The server's command line: one ``tritonserver``, or one per rank under ``mpirun``.

        Arguments:
            install: the located server; config: the launch; mpirun, is_root: as ``launch_argv`` takes them.
        """
        from trtllm_kit.serve.launcher import launch_argv

        return launch_argv(install, config, mpirun=mpirun, is_root=is_root)
