"""Whether an adapter was made for the artifact's base model, by the names the two record.

PEFT records the base in ``adapter_config.json`` as ``base_model_name_or_path``: a hub id (``org/NAME``) or the
local directory it was loaded from. The artifact records its model as given (``builtin:NAME``, a directory or a hub
id) and the directory it was read from (for a hub id, a cache snapshot ``models--ORG--NAME/snapshots/REV``). A
model's name is the last component that names it: ``NAME`` of a hub id or a cache folder, a directory's own name,
a built-in model's name (its cache directory ``builtin/NAME-KEY`` included), compared without case. The adapter
matches when its recorded path is the artifact's directory or its name is one of the artifact's names; an adapter
that records no base matches any. Shapes that match say nothing of the weights they were trained with.
"""

from __future__ import annotations

import os
import re

from trtllm_kit.artifact import Artifact
from trtllm_kit.lora.peft_adapter import CONFIG_NAME, AdapterError, PeftAdapter
from trtllm_kit.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX

CACHE_FOLDER = re.compile(r"models--[^/]+--([^/]+)")


def model_name(text: str) -> str:
    """The name a model source or directory names, lower-cased: ``Org/Llama-3-8B`` and ``/models/llama-3-8b/`` are
    both ``llama-3-8b``.

    Arguments:
        text: a hub id, a directory, a cache snapshot or ``builtin:NAME``.
    """
    if text.startswith(BUILTIN_PREFIX):
        return text.removeprefix(BUILTIN_PREFIX).lower()
    parts = [p for p in re.split(r"[/\\]", text) if p not in ("", ".")]  # a Windows path's too
    if len(parts) >= 3 and parts[-2] == "snapshots" and CACHE_FOLDER.fullmatch(parts[-3]):
        parts = parts[:-2]
    if not parts:
        return ""
    last = parts[-1]
    cached = CACHE_FOLDER.fullmatch(last)
    if cached:
        return cached[1].lower()
    if len(parts) >= 2 and parts[-2] == "builtin":
        last = next((name for name in BUILTIN_MODELS if last.startswith(f"{name}-")), last)
    return last.lower()


def check_base(adapter: PeftAdapter, artifact: Artifact) -> None:
    """Refuse an adapter whose recorded base model is not the artifact's (see the module's rules).

    Arguments:
        adapter: the checked adapter; artifact: the base artifact.
    """
    recorded = adapter.base_model
    if not recorded:
        return
    model = artifact.records.model
    source = artifact.model_source
    directories = [model.path] if model is not None else []
    if _is_directory_of(recorded, directories):
        return
    names = {model_name(source), *(model_name(d) for d in directories)} - {""}
    if model_name(recorded) in names:
        return
    raise AdapterError(f"{adapter.path / CONFIG_NAME} records base_model_name_or_path {recorded!r:.200}, but "
                       f"{artifact.path} is built from {source!r}; an adapter trained on another model gives wrong "
                       "output even when its shapes fit: use one trained on this model, or if it is this model under "
                       "another name, take it with lora add/load --force (\"force\": true in a load_lora_adapter "
                       "body).")


def _is_directory_of(recorded: str, directories: list[str]) -> bool:
    """Whether ``recorded`` is an absolute path that resolves to one of ``directories``."""
    if not os.path.isabs(recorded) or "\0" in recorded:
        return False
    try:
        return any(os.path.realpath(recorded) == os.path.realpath(d) for d in directories)
    except OSError:
        return False
