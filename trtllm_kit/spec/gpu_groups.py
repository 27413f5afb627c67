"""Several ``LLM`` instances in one llmapi repository: ``gpu_device_ids`` ("0,1;2,3") gives each instance of the
``tensorrt_llm`` model its own GPUs, one ``;``-separated group of ``tp x pp`` device ids per instance. The
repository writes it where upstream's ``llmapi`` model reads it (``config.pbtxt``'s ``gpu_device_ids``
parameter, with ``instance_group { count: N }``); the model file sets ``CUDA_VISIBLE_DEVICES`` to its group
before TensorRT-LLM is imported, so every instance's ``LLM`` sees only its own GPUs."""

from __future__ import annotations

from trtllm_kit.errors import KitUsageError
from trtllm_kit.mapping import Mapping

GpuGroups = tuple[tuple[int, ...], ...]


def parse_gpu_device_ids(text: str) -> GpuGroups:
    """The GPU groups of ``text``: ``;`` between instances, ``,`` between one instance's device ids.

    Arguments:
        text: e.g. ``0,1;2,3`` (two instances of two GPUs each).
    """
    groups = []
    for part in str(text).split(";"):
        ids = [item.strip() for item in part.split(",")]
        if not all(item.isdigit() for item in ids):
            raise KitUsageError(f"gpu_device_ids {text!r} is not a list of GPU groups; write the device ids of each "
                                "instance separated by commas and the instances by semicolons, e.g. 0,1;2,3.")
        group = tuple(int(item) for item in ids)
        if len(set(group)) != len(group):
            raise KitUsageError(f"gpu_device_ids {text!r} names GPU {_first_repeat(group)} twice in one instance; "
                                "give each instance distinct GPUs.")
        groups.append(group)
    return tuple(groups)


def check_gpu_groups(groups: GpuGroups, tp: int, pp: int) -> None:
    """Each instance needs exactly ``tp x pp`` GPUs and no GPU serves two instances.

    Arguments:
        groups: from ``parse_gpu_device_ids``; tp, pp: the build's parallel sizes.
    """
    world = Mapping(tp, pp).world_size
    for index, group in enumerate(groups):
        if len(group) != world:
            raise KitUsageError(f"gpu_device_ids gives instance {index} {len(group)} GPU(s) ({_ids(group)}), but "
                                f"--tp {tp} --pp {pp} needs {world} per instance; list {world} device ids in each "
                                "group.")
    used = [gpu for group in groups for gpu in group]
    if len(set(used)) != len(used):
        raise KitUsageError(f"gpu_device_ids gives GPU {_first_repeat(tuple(used))} to two instances; each LLM "
                            "takes most of its GPUs' memory for its KV cache, so give the instances disjoint GPUs.")


def describe(groups: GpuGroups) -> str:
    """One sentence for ``plan``: how many instances, and each one's GPUs.

    Arguments:
        groups: from ``parse_gpu_device_ids``.
    """
    each = "; ".join(f"instance {i} on GPU {_ids(g)}" for i, g in enumerate(groups))
    return (f"{len(groups)} tensorrt_llm instances, each its own LLM ({each}): config.pbtxt's gpu_device_ids and "
            "instance_group count; each instance sets CUDA_VISIBLE_DEVICES to its group before TensorRT-LLM loads, "
            "and Triton spreads requests over the instances")


def format_groups(groups: GpuGroups) -> str:
    """``0,1;2,3``: the parameter's text.

    Arguments:
        groups: from ``parse_gpu_device_ids``.
    """
    return ";".join(_ids(g) for g in groups)


def _ids(group: tuple[int, ...]) -> str:
    return ",".join(str(gpu) for gpu in group)


def _first_repeat(ids: tuple[int, ...]) -> int:
    return next(gpu for i, gpu in enumerate(ids) if gpu in ids[:i])
