"""The typed sections of an artifact's manifest: one record per build stage, each with its JSON form (the
sections of one build together: ``stage_records.py``).

A record is what a stage hands to the next and what a later build reuses from the cache; ``to_dict`` and
``from_dict`` are exact inverses for every record, so a manifest read back equals the one written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from trtllm_kit.mapping import Mapping
from trtllm_kit.plan import BuildPlan
from trtllm_kit.spec.repo_options import RepoOptions


def _known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are fields of the dataclass ``cls``."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


@dataclass(frozen=True)
class ModelRecord:
    """The Hugging Face model the artifact was built from."""

    source: str
    path: str
    family: str
    architecture: str | None
    num_parameters: int

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelRecord:
        return cls(**_known(cls, values))


@dataclass(frozen=True)
class CheckpointRecord:
    """``checkpoint/``: the TensorRT-LLM checkpoint's dtype and its ``quantization`` block (None: unquantized)."""

    dir: str
    dtype: str
    world_size: int
    tp_size: int
    pp_size: int
    quantization: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if self.quantization is None:
            del values["quantization"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CheckpointRecord:
        return cls(**_known(cls, values))


@dataclass(frozen=True)
class EngineBuild:
    """What a compile produced and with which tools, on which GPU (engines run only there)."""

    dir: str
    world_size: int
    tp_size: int
    pp_size: int
    tensorrt_llm: str | None
    tensorrt: str | None
    cuda: str | None
    driver: str | None
    gpu: str
    compute_capability: str | None
    effective: dict[str, Any] = field(default_factory=dict)
    compile_seconds: float = 0.0


@dataclass(frozen=True)
class EngineRecord:
    """The compile stage: the target it ran for and why, the plan, the command, and what it built (if it did)."""

    target: str
    reason: str
    command: list[str] | None = None
    plan: BuildPlan | None = None
    built: EngineBuild | None = None
    draft_command: list[str] | None = None  # draft-target speculation: the draft engine's trtllm-build
    draft: EngineBuild | CheckpointRecord | None = None  # and what it built (the cpu target: the draft's checkpoint)
    heads: dict[str, Any] | None = None  # speculative heads built into the engine (Medusa: kind, source, counts)

    @property
    def kv_cache_fraction(self) -> float | None:
        """The KV-cache memory fraction the plan sized ``max_batch_size`` with (None without a plan)."""
        return self.plan.kv_cache_fraction if self.plan is not None else None

    @property
    def context_logits(self) -> bool:
        """Whether the engine was built with ``--gather_context_logits`` (``[build] context_logits``): requests may
        ask it for the prompt's logits."""
        return "--gather_context_logits" in (self.command or [])

    def to_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {"target": self.target, "reason": self.reason, "command": self.command,
                                  "plan": self.plan.to_dict() if self.plan is not None else None}
        if self.built is not None:
            values.update(asdict(self.built))
        if self.draft_command is not None:
            values["draft_command"] = self.draft_command
        if self.draft is not None:
            values["draft"] = self.draft.to_dict() if isinstance(self.draft, CheckpointRecord) else asdict(self.draft)
        if self.heads is not None:
            values["heads"] = self.heads
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineRecord:
        built = EngineBuild(**_known(EngineBuild, values)) if values.get("dir") else None
        reason = values.get("reason") or values.get("skipped") or ""  # schema 1 said "skipped" when not compiled
        plan = BuildPlan.from_dict(values["plan"]) if values.get("plan") else None
        draft = _draft_record(values["draft"]) if values.get("draft") else None
        return cls(target=values["target"], reason=reason, command=values.get("command"), plan=plan, built=built,
                   draft_command=values.get("draft_command"), draft=draft, heads=values.get("heads"))


def _draft_record(values: dict[str, Any]) -> EngineBuild | CheckpointRecord:
    """A draft's record as the manifest holds it: an engine build (it names its GPU) or the cpu target's checkpoint."""
    if "gpu" in values:
        return EngineBuild(**_known(EngineBuild, values))
    return CheckpointRecord.from_dict(values)


@dataclass(frozen=True)
class EngineLimits:
    """Shapes and features fixed when the engine was built (or chosen for the CPU runtime)."""

    target: str  # a registered target name (trtllm_kit.targets)
    model_dir: Path  # the engine directory, or the checkpoint directory for "cpu"
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    max_beam_width: int
    tokens_per_block: int
    use_paged_context_fmha: bool
    tp_size: int
    pp_size: int
    vocab_size: int | None = None
    # what the target serves the model directory with, not limits: left out of ``to_dict``
    rank_file_pattern: str = field(default="rank*.engine", compare=False)  # one file per rank in model_dir
    slot_model: str | None = field(default=None, compare=False)  # the kit's Python model in the slot (None: C++)

    @property
    def mapping(self) -> Mapping:
        return Mapping(self.tp_size, self.pp_size)

    @property
    def world_size(self) -> int:
        return self.mapping.world_size

    @property
    def num_rank_files(self) -> int:
        return sum(1 for _ in self.model_dir.glob(self.rank_file_pattern))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineLimits:
        """The limits ``to_dict`` wrote (``model_dir`` as its directory name).

        Arguments:
            values: a repository record's ``limits``.
        """
        return cls(**{**_known(cls, values), "model_dir": Path(values["model_dir"])})

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        del values["rank_file_pattern"], values["slot_model"]
        values["model_dir"] = self.model_dir.name  # "engines" or "checkpoint": built in a staging dir, then moved
        return values


@dataclass(frozen=True)
class LlmapiRepoOptions:
    """The llmapi repository's options: decoupled or not, the ``LLM()`` arguments its ``model.yaml`` holds, and the
    ``tensorrt_llm`` instances (one per GPU group of ``gpu_device_ids``)."""

    decoupled: bool
    llm_args: dict[str, Any]
    instances: int = 1
    gpu_device_ids: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RepoRecord:
    """``repo/``: the Triton model repository, its models, the limits it was written for and its options."""

    dir: str
    schema: str
    target: str
    models: list[str]
    text: bool
    gpt_model_path: str
    limits: EngineLimits
    options: RepoOptions | LlmapiRepoOptions  # the resolved [repo] table, or the llmapi repository's own

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "limits": self.limits.to_dict(), "options": self.options.to_dict()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RepoRecord:
        options = values.get("options") or {}
        typed = LlmapiRepoOptions(**_known(LlmapiRepoOptions, options)) if "llm_args" in options else \
            RepoOptions.from_values(options)
        return cls(**{**_known(cls, values), "limits": EngineLimits.from_dict(values["limits"]), "options": typed})


@dataclass(frozen=True)
class CacheRecord:
    """The stage cache: each stage's key, which stages were reused, and the inputs' size/mtime fingerprints."""

    stages: dict[str, str] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    fingerprints: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CacheRecord:
        return cls(**_known(cls, values))


@dataclass(frozen=True)
class AdapterRecord:
    """A LoRA adapter added to the artifact (``trtllm-kit lora add``): where it came from, its PEFT hyperparameters,
    and the converted file the target loads (``dir``, relative to the artifact)."""

    name: str
    source: str  # the PEFT adapter directory it was converted from
    sha256: str  # of the source's adapter_model.safetensors
    rank: int
    alpha: float
    target_modules: list[str]  # PEFT names (q_proj, ...), sorted
    dir: str

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AdapterRecord:
        return cls(**{**_known(cls, values), "target_modules": list(values["target_modules"])})


@dataclass(frozen=True)
class LoraRecord:
    """The LoRA support a build settled (``lora/settings.py``): the modules adapters may target, the highest rank
    and the adapter cache's size. An engine's LoRA plugin and the llmapi ``LoraConfig`` are built for exactly these."""

    target_modules: list[str]  # PEFT names (q_proj, ...), in the family's order
    max_lora_rank: int
    max_loras: int

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LoraRecord:
        return cls(**{**_known(cls, values), "target_modules": list(values["target_modules"])})
