"""Which GPUs an instance of the llmapi model runs on: several instances each run their own ``LLM``, and
``config.pbtxt``'s ``gpu_device_ids`` parameter ("0,1;2,3") gives one group per instance.
"""

from __future__ import annotations

import json
import re


def instance_gpus(args: dict[str, str]) -> tuple[int, int, str | None]:
    """(this instance's index, the instance count, its GPU ids) from ``config.pbtxt``: ``instance_group`` counts
    the instances and the ``gpu_device_ids`` parameter gives one ``;``-separated group per instance; Triton names
    instances ``<group>_<index>``, which gives the index. No parameter: one instance on the visible GPUs.

    Arguments:
        args: ``initialize``'s arguments (``model_config`` JSON, ``model_instance_name``).
    """
    config = json.loads(args.get("model_config") or "{}")
    count = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    ids = config.get("parameters", {}).get("gpu_device_ids", {}).get("string_value", "")
    match = re.search(r"_(\d+)$", args.get("model_instance_name", ""))
    index = int(match.group(1)) if match and count > 1 else 0
    if not ids:
        if count > 1:
            raise ValueError(f"{count} instances need the gpu_device_ids parameter (one GPU group per instance, "
                             "e.g. 0,1;2,3); rebuild with --gpu-device-ids")
        return index, count, None
    groups = [group.strip() for group in ids.split(";")]
    if index >= len(groups):
        raise ValueError(f"instance {index} has no GPU group in gpu_device_ids {ids!r} ({len(groups)} groups)")
    return index, count, groups[index]
