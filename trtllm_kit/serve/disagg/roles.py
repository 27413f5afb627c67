"""What both disaggregated serves check and share: the artifact must be one llmapi OUT, the OpenAI port is where
clients come in, and each role's engine options carry the cache transceiver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trtllm_kit.artifact import Artifact
from trtllm_kit.artifact.integrity import check_artifact
from trtllm_kit.errors import KitUsageError
from trtllm_kit.serve.options import ServeOptions

ROLES = ("context", "generation")


def check_disagg(options: ServeOptions) -> Artifact:
    """The artifact of the one llmapi OUT a ``--disagg`` serve takes, checked against its other flags (its files
    too, as ``serve`` checks them).

    Arguments:
        options: the serve.
    """
    if len(options.outs) > 1 or options.aliases:
        raise KitUsageError("--disagg serves one OUT; serve several without --disagg.")
    if options.settings.openai_port is None:
        raise KitUsageError("--disagg answers on the OpenAI port only (the two-step request); add --openai-port "
                            "PORT.")
    artifact = Artifact.read(options.out)
    if artifact.target != "llmapi":
        raise KitUsageError(f"{options.out} is a target {artifact.target} build; --disagg serves llmapi builds "
                            "(trtllm-kit build MODEL --target llmapi).")
    check_artifact(artifact, hashes=options.settings.verify)
    return artifact


def transceiver_options(options: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """LLM-API options with ``cache_transceiver_config`` set for a disaggregated role (backend ``DEFAULT``,
    ``kv_transfer_timeout_ms`` from ``--kv-transfer-timeout``), what the artifact said of it kept otherwise.

    Arguments:
        options: the artifact's ``model.yaml`` or ``extra_llm_api_options`` values; timeout_s: the setting.
    """
    config = dict(options.get("cache_transceiver_config") or {})
    config.setdefault("backend", "DEFAULT")
    config["kv_transfer_timeout_ms"] = int(timeout_s * 1000)
    return {**options, "cache_transceiver_config": config}


def write_transceiver_options(path: Path, timeout_s: float) -> None:
    """Rewrite an LLM-API options file (a working copy) with ``transceiver_options``.

    Arguments:
        path: the YAML file; timeout_s: the setting.
    """
    values = yaml.safe_load(path.read_text()) or {}
    path.write_text(yaml.safe_dump(transceiver_options(values, timeout_s), sort_keys=False))
