"""An engine's ``config.json`` as TensorRT-LLM 0.12–1.2 writes it: ``pretrained_config`` (with the ``mapping``)
and ``build_config`` (with the ``plugin_config``). The one reader of that file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_kit.errors import KitError
from trtllm_kit.jsonfile import read_json
from trtllm_kit.mapping import Mapping


@dataclass(frozen=True)
class EngineConfigFile:
    """A parsed engine ``config.json``."""

    path: Path
    values: dict[str, Any]

    @property
    def build(self) -> dict[str, Any]:
        return self.values["build_config"]

    @property
    def pretrained(self) -> dict[str, Any]:
        return self.values["pretrained_config"]

    @property
    def plugin(self) -> dict[str, Any]:
        return self.build.get("plugin_config") or {}

    @property
    def mapping(self) -> Mapping:
        return Mapping.from_dict(self.pretrained.get("mapping") or {}, str(self.path))


def read_engine_config(engine_dir: Path, missing: str) -> EngineConfigFile:
    """Read ``engine_dir/config.json``, refusing a file without ``build_config`` and ``pretrained_config``.

    Arguments:
        engine_dir: the engine directory; missing: the sentence to raise when ``config.json`` does not exist.
    """
    path = engine_dir / "config.json"
    config = read_json(path, missing)
    if not isinstance(config.get("build_config"), dict) or not isinstance(config.get("pretrained_config"), dict):
        found = "builder_config (a pre-0.8 engine)" if "builder_config" in config else f"keys {sorted(config)}"
        raise KitError(f"{path} lacks build_config/pretrained_config (found {found}); rebuild the engine with "
                       "TensorRT-LLM 0.12–1.2.")
    return EngineConfigFile(path, config)
