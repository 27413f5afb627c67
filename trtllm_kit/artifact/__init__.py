"""The artifact a build writes and every later command reads: ``Artifact`` and its stage records."""

from trtllm_kit.artifact.manifest import (
    MANIFEST,
    SCHEMA_VERSION,
    Artifact,
    ManifestError,
    read_manifest_json,
    upgrade_manifest,
)
from trtllm_kit.artifact.records import (
    AdapterRecord,
    CacheRecord,
    CheckpointRecord,
    EngineBuild,
    EngineLimits,
    EngineRecord,
    LlmapiRepoOptions,
    LoraRecord,
    ModelRecord,
    RepoRecord,
)
from trtllm_kit.artifact.stage_records import StageRecords

__all__ = [
    "MANIFEST", "SCHEMA_VERSION", "AdapterRecord", "Artifact", "CacheRecord", "CheckpointRecord", "EngineBuild",
    "EngineLimits", "EngineRecord", "LlmapiRepoOptions", "LoraRecord", "ManifestError", "ModelRecord", "RepoRecord",
    "StageRecords", "read_manifest_json", "upgrade_manifest",
]
