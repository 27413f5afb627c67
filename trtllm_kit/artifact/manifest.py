"""The artifact: what ``build`` writes into ``OUT/manifest.json`` and every later command reads, typed.

``Artifact.read`` is the one reader (one set of error sentences); nothing outside this package indexes the
manifest's JSON. A manifest of an older ``schema_version`` is refused with the command that upgrades it
(``trtllm-kit artifact upgrade OUT``), which ``upgrade_manifest`` implements.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trtllm_kit.artifact.records import CacheRecord
from trtllm_kit.artifact.stage_records import StageRecords
from trtllm_kit.errors import KitError, KitUsageError
from trtllm_kit.mapping import Mapping
from trtllm_kit.precision import Precision
from trtllm_kit.spec import BuildSpec, nest_flat_spec

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"


class ManifestError(KitError):
    """A manifest that cannot be read as this kit's artifact (damaged, foreign or from another schema)."""


@dataclass(frozen=True)
class Artifact:
    """A build's output directory as data: spec, layout, precision, target, stage records, files and tools."""

    path: Path
    spec: BuildSpec
    target: str
    layout: Mapping
    precision: Precision
    records: StageRecords
    files: dict[str, str]  # path relative to the artifact → sha256 (manifest.json excluded)
    file_stats: dict[str, list[int]] = field(default_factory=dict)  # path → [size, mtime_ns] when written
    inputs: dict[str, str] = field(default_factory=dict)
    tools: dict[str, str | None] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    cache: CacheRecord = field(default_factory=CacheRecord)
    timings_s: dict[str, float] = field(default_factory=dict)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    schema_version: int = SCHEMA_VERSION

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def model_source(self) -> str:
        return self.records.model.source if self.records.model else self.spec.model

    @property
    def has_engines(self) -> bool:
        return bool(self.records.engine and self.records.engine.built)

    @property
    def kv_cache_fraction(self) -> float | None:
        """The KV-cache fraction the build plan sized ``max_batch_size`` with (None without a plan)."""
        return self.records.engine.kv_cache_fraction if self.records.engine else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON body of ``manifest.json``."""
        return {
            "schema_version": self.schema_version, "argv": self.argv, "spec": self.spec.to_dict(),
            "target": self.target, "layout": _layout_dict(self.layout),
            "precision": {**asdict(self.precision), "weights": self.precision.weight_dtype,
                          "activations": self.precision.activation_dtype, "kv_cache": self.precision.kv_dtype},
            "summary": self.records.to_dict(), "inputs": self.inputs, "tools": self.tools, "machine": self.machine,
            "cache": asdict(self.cache), "timings_s": self.timings_s, "outputs": self.files,
            "output_stats": self.file_stats,
        }

    def write(self) -> Path:
        """Write ``manifest.json`` into ``path`` (the staging directory during a build)."""
        self.manifest_path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return self.manifest_path

    def moved(self, path: Path) -> Artifact:
        """The same artifact at another directory (a staging directory renamed into place)."""
        return replace(self, path=path)

    @classmethod
    def from_dict(cls, values: dict[str, Any], path: Path, source: str | None = None) -> Artifact:
        """Read a parsed manifest of this schema version.

        Arguments:
            values: the JSON body; path: the artifact directory; source: where it came from, for errors.
        """
        where = source or str(path / MANIFEST)
        _check_version(values, where, path)
        try:
            layout, precision = values["layout"], values["precision"]
            return cls(
                path=path, spec=_spec(values["spec"], where), target=str(values["target"]),
                layout=Mapping(int(layout["tp_size"]), int(layout["pp_size"])),
                precision=Precision(precision["dtype"], precision.get("quant_algo"),
                                    precision.get("kv_cache_quant_algo")),
                records=StageRecords.from_dict(values["summary"]), files=dict(values["outputs"]),
                file_stats=dict(values.get("output_stats") or {}),
                inputs=dict(values.get("inputs") or {}), tools=dict(values.get("tools") or {}),
                machine=dict(values.get("machine") or {}), cache=CacheRecord.from_dict(values.get("cache") or {}),
                timings_s=dict(values.get("timings_s") or {}), argv=list(values.get("argv") or []),
                schema_version=SCHEMA_VERSION)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"{where} is damaged ({type(exc).__name__}: {exc}); rebuild the artifact "
                                "(trtllm-kit build ... --force).") from None

    @classmethod
    def read(cls, out: Path) -> Artifact:
        """Read ``OUT/manifest.json``.

        Arguments:
            out: the artifact directory (a build's ``--out``).
        """
        return cls.from_dict(read_manifest_json(out), out)


def _layout_dict(layout: Mapping) -> dict[str, Any]:
    ranks = [{"rank": r, "tp_rank": layout.tp_rank(r), "pp_rank": layout.pp_rank(r)} for r in range(layout.world_size)]
    return {**layout.to_dict(), "ranks": ranks}


def read_manifest_json(out: Path) -> dict[str, Any]:
    """The parsed ``OUT/manifest.json`` of any schema version, with one sentence for each way it can fail.

    Arguments:
        out: the artifact directory.
    """
    if not out.is_dir():
        raise KitUsageError(f"{out} is not a directory; pass a trtllm-kit build output (trtllm-kit build ... --out).")
    path = out / MANIFEST
    if not path.is_file():
        raise KitUsageError(f"{out} has no {MANIFEST}; it is not a trtllm-kit artifact (run trtllm-kit build).")
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} cannot be read ({exc}); rebuild the artifact (trtllm-kit build ... "
                            "--force).") from None
    if not isinstance(values, dict):
        raise ManifestError(f"{path} holds a JSON {type(values).__name__}, not a manifest object; rebuild the "
                            "artifact.")
    return values


def _check_version(values: dict[str, Any], where: str, path: Path) -> None:
    version = values.get("schema_version")
    if version == SCHEMA_VERSION:
        return
    if isinstance(version, int) and 0 < version < SCHEMA_VERSION:
        raise ManifestError(f"{where} has schema_version {version}; this kit reads {SCHEMA_VERSION}: run "
                            f"trtllm-kit artifact upgrade {path} (or rebuild it).")
    raise ManifestError(f"{where} has schema_version {version!r}; this kit reads {SCHEMA_VERSION}: read it with the "
                        "trtllm-kit release that wrote it, or rebuild the artifact with this one.")


def _spec(values: dict[str, Any], where: str) -> BuildSpec:
    try:
        return BuildSpec.from_dict(values)
    except (KitError, TypeError) as exc:
        raise ManifestError(f"{where} records a spec this kit does not read ({exc}); rebuild the artifact.") from None


def upgrade_manifest(out: Path) -> tuple[int, int]:
    """Rewrite ``OUT/manifest.json`` of an older schema version as this one; returns (old, new) versions.

    Only the manifest changes (the files and their hashes stay as built); it is written to a temporary file
    and renamed into place.

    Arguments:
        out: the artifact directory.
    """
    values = read_manifest_json(out)
    old = values.get("schema_version")
    if old == SCHEMA_VERSION:
        return SCHEMA_VERSION, SCHEMA_VERSION
    if old != 1:
        _check_version(values, str(out / MANIFEST), out)
    upgraded = _upgrade_from_1(values)
    artifact = Artifact.from_dict(upgraded, out)  # the upgraded manifest must read back
    tmp = out / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(artifact.to_dict(), indent=2) + "\n")
    tmp.replace(out / MANIFEST)
    return 1, SCHEMA_VERSION


def _upgrade_from_1(values: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: the target, layout and precision become top-level records; ``skipped`` becomes ``reason``."""
    try:
        spec = _spec(nest_flat_spec(values["spec"]), "the schema 1 manifest")
        summary = dict(values["summary"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"the schema 1 manifest is damaged ({exc}); rebuild the artifact.") from None
    engine = dict(summary.get("engine") or {})
    if "skipped" in engine:
        engine["reason"] = engine.pop("skipped")
    if engine:
        summary["engine"] = engine
    target = (summary.get("repo") or {}).get("target") or engine.get("target") or "cpu"
    quant = spec.quant_config()
    checkpoint = summary.get("checkpoint") or {}
    dtype = checkpoint.get("dtype") or spec.build.dtype
    return {**values, "schema_version": SCHEMA_VERSION, "spec": spec.to_dict(), "target": target,
            "layout": _layout_dict(Mapping(spec.build.tp, spec.build.pp)),
            "precision": {"dtype": dtype, "quant_algo": quant.quant_algo,
                          "kv_cache_quant_algo": quant.kv_cache_quant_algo},
            "summary": summary}
