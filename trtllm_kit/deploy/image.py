"""The serving image and the TensorRT-LLM inside it.

``docker/Dockerfile`` builds the image from NVIDIA's Triton TensorRT-LLM container
(``nvcr.io/nvidia/tritonserver:<release>-trtllm-python-py3``) with the kit installed from a wheel of this
checkout, and records the container's TensorRT-LLM version as the label ``VERSION_LABEL``. ``deploy k8s`` cannot
read labels of a remote image offline, so the version travels in the tag too (``TAG_CONVENTION``), or is given
with ``--image-trtllm-version``; where it is known, an engine built with another TensorRT-LLM is refused.
"""

from __future__ import annotations

import re

from trtllm_kit.errors import KitUsageError

VERSION_LABEL = "io.trtllm-kit.tensorrt-llm-version"
TAG_CONVENTION = "REGISTRY/trtllm-kit:<kit version>-trtllm<TensorRT-LLM version>"
TAG_VERSION = re.compile(r"-trtllm(\d+\.\d+\.\d+[0-9a-z.]*)$")
# TensorRT-LLM version → the Triton container release that ships it (triton-inference-server/tutorials,
# Popular_Models_Guide/Qwen2.5-VL: "The 26.07 container ships TensorRT-LLM v1.2.1")
TRITON_CONTAINERS = {"1.2.1": "26.07"}


def base_image(tensorrt_llm: str) -> str:
    """NVIDIA's Triton container that ships ``tensorrt_llm``.

    Arguments:
        tensorrt_llm: a TensorRT-LLM version the table knows.
    """
    release = TRITON_CONTAINERS.get(tensorrt_llm)
    if release is None:
        raise KitUsageError(f"no Triton container release is recorded for TensorRT-LLM {tensorrt_llm} (known: "
                            f"{', '.join(TRITON_CONTAINERS)}); look it up in NVIDIA's framework support matrix.")
    return f"nvcr.io/nvidia/tritonserver:{release}-trtllm-python-py3"


def image_trtllm_version(image: str, given: str | None) -> str | None:
    """The TensorRT-LLM version of ``image``: ``given`` (``--image-trtllm-version``), else its tag's, else None.

    Arguments:
        image: the image reference; given: the version the user states.
    """
    if given:
        return given
    name = image.split("@", 1)[0]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    found = TAG_VERSION.search(tag)
    return found.group(1) if found else None


def check_image(image: str, given: str | None, artifact_version: str | None) -> None:
    """Refuse an image whose TensorRT-LLM differs from the one the artifact's engines were built with.

    Arguments:
        image: the image; given: ``--image-trtllm-version``; artifact_version: the engine build's (None: any).
    """
    version = image_trtllm_version(image, given)
    if artifact_version is not None and version is not None and version != artifact_version:
        raise KitUsageError(f"the image {image} holds TensorRT-LLM {version}, but the engines were built with "
                            f"{artifact_version}, and engines run only with the runtime that built them; build "
                            f"the image from {base_image_hint(artifact_version)} (docker/Dockerfile, tag "
                            f"{TAG_CONVENTION}) or rebuild the engines.")


def base_image_hint(version: str) -> str:
    try:
        return base_image(version)
    except KitUsageError:
        return f"the Triton container that ships TensorRT-LLM {version}"
