"""The artifact's LoRA adapters as the LLM API's ``LoRARequest``: ``lora_name`` names one of the adapters of
``manifest.json`` beside the model's directory; the request runs with ``LoRARequest(name, id from the adapter's
sha256, OUT/lora/NAME)``, a PEFT directory.
"""

from __future__ import annotations

import json
import os
from typing import Any


def lora_int_id(sha256: str) -> int:
    """An adapter's ``lora_int_id``: from the sha256 of its weights, so one id always names one adapter (the LoRA
    cache's key) across restarts and servers, and a changed adapter gets a new one; in [1, 2**60].

    Arguments:
        sha256: the adapter record's ``sha256``.
    """
    return 1 + int(sha256[:15], 16)


class Adapters:
    """The artifact's adapters by name, from its ``manifest.json`` (read again when it changes, so an adapter added
    or removed with ``trtllm-kit lora`` is seen without a restart)."""

    def __init__(self, artifact_dir: str) -> None:
        self.artifact_dir = artifact_dir
        self.manifest = os.path.join(artifact_dir, "manifest.json")
        self.stamp: int | None = None
        self.records: dict[str, dict] = {}

    def request(self, name: str, request_class: Any) -> Any:
        """The ``LoRARequest`` of the adapter ``name``; a name the manifest does not hold is refused.

        Arguments:
            name: the ``lora_name`` input; request_class: ``LoRARequest``.
        """
        stamp = os.stat(self.manifest).st_mtime_ns if os.path.exists(self.manifest) else None
        if stamp != self.stamp:
            self.records = {}
            if stamp is not None:
                with open(self.manifest) as f:
                    self.records = json.load(f).get("summary", {}).get("adapters", {})
            self.stamp = stamp
        record = self.records.get(name)
        if record is None:
            raise ValueError(f"LoRA adapter {name!r} is not in the artifact {self.artifact_dir} (it has: "
                             f"{', '.join(sorted(self.records)) or 'none'}); add it with trtllm-kit lora add")
        return request_class(name, lora_int_id(record["sha256"]), os.path.join(self.artifact_dir, record["dir"]))
