"""Where a GPU pod may run: engines on the GPU they were built for, FP8 on compute capability 8.9 or newer.

Both are required node affinities on the labels NVIDIA's GPU Feature Discovery puts on every GPU node:
``nvidia.com/gpu.product`` (the product name with ``-`` for spaces, ``NVIDIA-H100-80GB-HBM3``) and
``nvidia.com/gpu.compute.major``/``.minor``. A pod template that needs a compute capability also says so in the
annotation ``MIN_CC_ANNOTATION``, which ``deploy check`` holds its affinity to.
"""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.settings import DeploySettings
from trtllm_kit.deploy.source import DeploySource
from trtllm_kit.deploy.validate import Finding
from trtllm_kit.errors import KitUsageError
from trtllm_kit.gpus import GPU_TABLE

Obj = dict[str, Any]
PRODUCT_LABEL = "nvidia.com/gpu.product"
MAJOR_LABEL = "nvidia.com/gpu.compute.major"
MINOR_LABEL = "nvidia.com/gpu.compute.minor"
MIN_CC_ANNOTATION = "trtllm-kit.io/min-compute-capability"
FP8_MIN_CC = (8, 9)  # FP8 weights, activations and KV cache: Ada, Hopper, Blackwell


def product_label(name: str) -> str:
    """A GPU's name as GPU Feature Discovery writes it into ``nvidia.com/gpu.product``."""
    return "-".join(name.split())


def gpu_product(source: DeploySource, settings: DeploySettings) -> str | None:
    """The product the pods must run on: the engines' GPU (``--gpu-product`` must agree), else ``--gpu-product``.

    Arguments:
        source: the artifact (its engine build's GPU); settings: ``gpu_product``.
    """
    given = product_label(settings.gpu_product) if settings.gpu_product else None
    if source.gpu is None:
        return given
    built = product_label(source.gpu)
    if given is not None and given != built:
        raise KitUsageError(f"--gpu-product {settings.gpu_product} is not the GPU the engines were built for "
                            f"({source.gpu}, {PRODUCT_LABEL}={built}), and engines run only there; drop "
                            "--gpu-product, or rebuild the engines on that GPU.")
    return built


def min_compute_capability(source: DeploySource) -> tuple[int, int] | None:
    """The compute capability a checkpoint needs at least (FP8 weights or KV cache: 8.9), or None."""
    return FP8_MIN_CC if source.target != "cpu" and "FP8" in source.quant_algos else None


def _table_capability(product: str) -> tuple[int, int] | None:
    """The compute capability of a product the GPU table knows by its board name (``A100`` in ``NVIDIA-A100-...``)."""
    words = set(product.upper().split("-"))
    found = {board.compute_capability for name, board in GPU_TABLE.items() if name.split("-")[0] in words}
    return found.pop() if len(found) == 1 else None


def node_affinity(source: DeploySource, settings: DeploySettings) -> Obj | None:
    """The required node affinity of a GPU pod (product, compute capability), or None when nothing is pinned.

    Arguments:
        source: the artifact; settings: ``gpu_product``.
    """
    product = gpu_product(source, settings)
    needed = min_compute_capability(source)
    if needed is not None and product is not None:
        known = _table_capability(product)
        if known is not None and known < needed:
            raise KitUsageError(f"the checkpoint is quantized to {'/'.join(source.quant_algos)}, which needs "
                                f"compute capability {needed[0]}.{needed[1]} or newer, but {product} is "
                                f"{known[0]}.{known[1]}; choose an Ada, Hopper or Blackwell GPU.")
    pinned = [{"key": PRODUCT_LABEL, "operator": "In", "values": [product]}] if product else []
    if needed is None:
        terms = [pinned] if pinned else []
    else:
        major, minor = needed
        terms = [[*pinned, {"key": MAJOR_LABEL, "operator": "Gt", "values": [str(major)]}],
                 [*pinned, {"key": MAJOR_LABEL, "operator": "In", "values": [str(major)]},
                  {"key": MINOR_LABEL, "operator": "Gt", "values": [str(minor - 1)]}]]
    if not terms:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]}}}


def _lowest(expressions: list[Obj], label: str) -> int:
    """The smallest integer value a term admits for ``label`` (0 when it does not constrain it)."""
    lowest = 0
    for expression in expressions:
        if expression.get("key") != label:
            continue
        values = [int(v) for v in expression.get("values") or [] if str(v).isdigit()]
        if expression.get("operator") == "Gt" and values:
            lowest = max(lowest, values[0] + 1)
        elif expression.get("operator") == "In" and values:
            lowest = max(lowest, min(values))
    return lowest


def check_compute_capability(file: str, doc: Obj, template: Obj) -> list[Finding]:
    """A pod template whose annotation needs a compute capability its node affinity does not enforce."""
    wanted = ((template.get("metadata") or {}).get("annotations") or {}).get(MIN_CC_ANNOTATION)
    if not wanted:
        return []
    major, _, minor = str(wanted).partition(".")
    needed = (int(major), int(minor or 0))
    terms = ((((template.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms or [{}]:
        expressions = term.get("matchExpressions") or []
        lowest = (_lowest(expressions, MAJOR_LABEL), _lowest(expressions, MINOR_LABEL))
        if lowest[0] < needed[0] or (lowest[0] == needed[0] and lowest[1] < needed[1]):
            return [Finding(file, doc["kind"], doc["metadata"]["name"], "spec/affinity/nodeAffinity",
                            f"{MIN_CC_ANNOTATION} is {wanted} (an FP8 checkpoint), but a node selector term admits "
                            f"GPUs of compute capability {lowest[0]}.{lowest[1]}; require {MAJOR_LABEL} > "
                            f"{needed[0]}, or = {needed[0]} with {MINOR_LABEL} > {needed[1] - 1}")]
    return []
