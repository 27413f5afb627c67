"""The supported families, matched exactly by HF architecture."""

from __future__ import annotations

from trtllm_kit.errors import CheckpointError, ModelError
from trtllm_kit.models.base import Family
from trtllm_kit.models.hf_config import HFConfig
from trtllm_kit.models.llama import LLAMA
from trtllm_kit.models.mistral import MISTRAL
from trtllm_kit.models.phi3 import PHI3
from trtllm_kit.models.qwen2 import QWEN2

FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, QWEN2, PHI3)
SUPPORTED_ARCHITECTURES = tuple(a for f in FAMILIES for a in f.architectures)


def family_for(hf: HFConfig, source: str = "the model") -> Family:
    """The family of an HF config, by ``architectures[0]`` (or ``model_type`` when that is absent), after the
    family's own checks of the config.

    Arguments:
        hf: the normalised config.
        source: the model's name for the error message.
    """
    for family in FAMILIES:
        if hf.architecture in family.architectures or (not hf.architecture and hf.model_type in family.model_types):
            if family.check is not None:
                family.check(hf, source)
            return family
    found = hf.architecture or f"model_type {hf.model_type!r}"
    raise ModelError(f"{source} is a {found}, which the kit does not convert; supported architectures: "
                     f"{', '.join(SUPPORTED_ARCHITECTURES)}.")


def family_of_checkpoint(architecture: object, source: str) -> Family:
    """The family of a TensorRT-LLM checkpoint by its ``architecture`` key.

    Arguments:
        architecture: the checkpoint config's ``architecture`` value; source: its path, for the message.
    """
    for family in FAMILIES:
        if architecture in family.architectures:
            return family
    raise CheckpointError(f"{source} has architecture {architecture!r}; the CPU runtime runs "
                          f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
