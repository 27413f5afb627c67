"""The records the stages of one build have written so far (``StageRecords``, the manifest's ``summary``): one
section per stage, written and read back with each record's own JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trtllm_kit.artifact.records import (
    AdapterRecord,
    CheckpointRecord,
    EngineRecord,
    LoraRecord,
    ModelRecord,
    RepoRecord,
)


@dataclass
class StageRecords:
    """The records the stages of one build have written so far (the manifest's ``summary``)."""

    model: ModelRecord | None = None
    checkpoint: CheckpointRecord | None = None
    calibration: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None
    draft: dict[str, Any] | None = None  # the llmapi target's copy of the draft: its dir (relative), source, bytes
    engine: EngineRecord | None = None
    repo: RepoRecord | None = None
    stages: list[str] = field(default_factory=list)
    adapters: dict[str, AdapterRecord] = field(default_factory=dict)  # by name
    lora: LoraRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if self.model is not None:
            values["model"] = asdict(self.model)
        if self.checkpoint is not None:
            values["checkpoint"] = self.checkpoint.to_dict()
        for name in ("calibration", "verify", "draft"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        if self.engine is not None:
            values["engine"] = self.engine.to_dict()
        if self.repo is not None:
            values["repo"] = self.repo.to_dict()
        values["stages"] = list(self.stages)
        if self.adapters:
            values["adapters"] = {name: asdict(a) for name, a in self.adapters.items()}
        if self.lora is not None:
            values["lora"] = asdict(self.lora)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StageRecords:
        def section(name: str, reader: Any) -> Any:
            return reader(values[name]) if isinstance(values.get(name), dict) else None

        return cls(model=section("model", ModelRecord.from_dict),
                   checkpoint=section("checkpoint", CheckpointRecord.from_dict),
                   calibration=values.get("calibration"), verify=values.get("verify"), draft=values.get("draft"),
                   engine=section("engine", EngineRecord.from_dict), repo=section("repo", RepoRecord.from_dict),
                   stages=list(values.get("stages") or []),
                   adapters={name: AdapterRecord.from_dict(a) for name, a in (values.get("adapters") or {}).items()},
                   lora=section("lora", LoraRecord.from_dict))

    def take(self, other: StageRecords, names: tuple[str, ...]) -> None:
        """Copy the sections ``names`` from ``other`` (a reused stage brings its records along).

        Arguments:
            other: the earlier build's records; names: section names (``checkpoint``, ``verify``, …).
        """
        for name in names:
            setattr(self, name, getattr(other, name))
