"""What a serving target is: one object that owns every decision the build, the repository and serve make
differently per target (machine check, compile step, limits, repository models, validation, launch)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trtllm_kit.artifact import Artifact, EngineLimits, EngineRecord, LoraRecord, RepoRecord, StageRecords
from trtllm_kit.artifact.machine import Machine
from trtllm_kit.enums import GroupLaunch
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU
from trtllm_kit.mapping import Mapping
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.plan import BuildPlan
from trtllm_kit.precision import Precision
from trtllm_kit.progress import Reporter
from trtllm_kit.spec import BuildSpec
from trtllm_kit.trtllm_build.draft import DraftBuild
from trtllm_kit.trtllm_build.recipe import BuildCommand

if TYPE_CHECKING:  # the inspection imports torch; the registry stays torch-free for a fast CLI start
    from trtllm_kit.model_repo.lora import LoraServing
    from trtllm_kit.models.inspect import ModelSpec

KEY_EXCLUDED_FLAGS = ("input_timing_cache", "output_timing_cache", "workers", "log_level")


@dataclass(frozen=True)
class StartupTerms:
    """Seconds a target's server spends becoming ready beyond reading its weights (docs/deploy-kubernetes.md gives
    the source of each figure)."""

    runtime_init_s: int  # process and MPI start, CUDA contexts, NCCL communicators, runtime deserialisation
    kv_alloc_s: int  # sizing and allocating the paged KV-cache pool
    cuda_graphs_s: int  # capturing CUDA graphs (and the warm-up that goes with it)

    @property
    def total_s(self) -> int:
        return self.runtime_init_s + self.kv_alloc_s + self.cuda_graphs_s


@dataclass(frozen=True)
class EngineSetup:
    """The engine stage, settled before any heavy work."""

    target: Target
    reason: str                  # why this target, in words
    plan: BuildPlan | None       # None when no GPU is known (cpu target without --gpu/--gpu-memory)
    build_gpu: GPU | None        # the GPU the recipe is for
    command: BuildCommand | None
    machine: Machine
    lora: LoraRecord | None = None  # the LoRA support (lora/settings.py), or none
    draft: DraftBuild | None = None  # draft-target speculation on the engine target: the draft engine's build

    def key_parts(self) -> dict[str, Any]:
        """What decides the engines (the cache key of the stage)."""
        parts: dict[str, Any] = {"target": self.target.name}
        if self.command is not None:  # target cpu records the command it would run: it is part of the output
            parts["flags"] = {k: v for k, v in self.command.flags if k not in KEY_EXCLUDED_FLAGS}
            if self.command.switches:
                parts["switches"] = list(self.command.switches)
            if self.command.lists:
                parts["lists"] = {name: list(values) for name, values in self.command.lists}
        if self.lora is not None:
            parts["lora"] = asdict(self.lora)
        if self.draft is not None:  # its files are in the checkpoint's key (build/pipeline.py)
            parts["draft"] = {"flags": {k: v for k, v in self.draft.command.flags if k not in KEY_EXCLUDED_FLAGS},
                              "switches": list(self.draft.command.switches), "dtype": self.draft.dtype}
        if self.target.compiles and self.build_gpu is not None:
            parts.update(gpu=self.build_gpu.name, sm=self.build_gpu.sm, tensorrt_llm=self.machine.tensorrt_llm,
                         tensorrt=self.machine.tensorrt)
        return parts


@dataclass
class BuildContext:
    """What the stages share: the spec, the inspected model, the staging directory and the results so far."""

    spec: BuildSpec
    model: ModelSpec
    mapping: Mapping
    reporter: Reporter
    out: Path
    records: StageRecords = field(default_factory=StageRecords)
    timings: dict[str, float] = field(default_factory=dict)
    engine: EngineSetup | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # sha256 of each input file (the manifest's ``inputs``)


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
    uses_gpus: ClassVar[bool] = True  # a replica takes one GPU per rank (else it runs on CPUs)
    # one server process per rank (mpirun), each loading its rank's weights, so a replica can span nodes;
    # else one process loads the whole checkpoint
    process_per_rank: ClassVar[bool] = False
    group_launch: ClassVar[GroupLaunch | None] = None  # how ranks start across a group's pods (None: one pod)
    startup_terms: ClassVar[StartupTerms]

    def check_spec(self, spec: BuildSpec) -> None:
        """Refuse, before any heavy work, a spec this target cannot build (default: every spec is fine).

        Arguments:
            spec: the build spec.
        """
        from trtllm_kit.checkpoint.prequantized_checks import check_trtllm_input
        from trtllm_kit.models.inspect import inspect_model, resolve_model_path
        from trtllm_kit.quant.algos import check_target
        from trtllm_kit.quant.prequantized import detect_prequantized

        check_target(spec.quant_config(), self.name)
        fmt = detect_prequantized(resolve_model_path(spec.model))
        if fmt is not None:  # converted with its own scales (checkpoint/prequantized_checks.py); headers only here
            check_trtllm_input(fmt, inspect_model(spec.model, allow_pickle=spec.build.allow_pickle),
                               spec.quant_config(), self.name, spec.build.tp)
        if spec.repo.gpu_device_ids is not None:
            raise KitUsageError(f"--gpu-device-ids applies to --target llmapi only (one LLM per GPU group); the "
                                f"{self.name} target's repository runs one tensorrt_llm instance, so drop the option "
                                "or build with --target llmapi.")

    @abstractmethod
    def write_checkpoint(self, ctx: BuildContext) -> None:
        """The checkpoint stage: ``checkpoint/`` and ``tokenizer/``."""

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

    def lora_serving(self, model_dir: Path, spec: BuildSpec) -> LoraServing | None:
        """How the ``tensorrt_llm`` slot over ``model_dir`` takes LoRA adapters; None: it takes none (default).

        Arguments:
            model_dir: the directory gpt_model_path names; spec: the build spec.
        """
        return None

    def serve_problems(self, artifact: Artifact, machine: Machine | None) -> list[str]:
        """What keeps ``artifact`` from being served here; empty when it can be.

        Arguments:
            artifact: the artifact; machine: this machine (detected when None and the target needs it).
        """
        return []

    def launch_world_size(self, artifact: Artifact) -> int:
        """How many server processes (MPI ranks) the launch starts."""
        return artifact.layout.world_size if self.process_per_rank else 1

    def own_plan(self, spec: BuildSpec, hf: HFConfig, family: Family, precision: Precision,
                 gpu: GPU | None, lora: LoraRecord | None = None) -> dict[str, Any] | None:
        """The plan of a target that builds no engine (its recipe, memory and serve command), keyed by its name
        in ``plan``'s report; None: the engine plan applies (default).

        Arguments:
            spec: the build spec; hf, family: the model; precision: the checkpoint's; gpu: the planned GPU;
            lora: the build's LoRA support, or none.
        """
        return None
