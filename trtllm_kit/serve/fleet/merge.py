"""Several build outputs in one Triton model repository: each model copied under a prefixed name, every reference
to a model rewritten, pre/postprocessing shared where their directories are byte-identical.

With one output and no prefix the copy is the repository as built (``ensemble``, ``tensorrt_llm_bls``,
``tensorrt_llm``, ``preprocessing``, ``postprocessing``). With a prefix ``P`` each model ``m`` becomes ``P{m}``;
the config's ``name``, the ensemble steps' ``model_name`` and the BLS's ``tensorrt_llm_model_name``,
``preprocessing_model_name`` and ``postprocessing_model_name`` parameters follow.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_kit.errors import KitUsageError
from trtllm_kit.names import TRTLLM_MODEL

SHARABLE = ("preprocessing", "postprocessing")
BLS_PARAMETERS = {"tensorrt_llm_model_name": TRTLLM_MODEL, "preprocessing_model_name": "preprocessing",
                  "postprocessing_model_name": "postprocessing"}
TRITON_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
# Load order: what the text models call first, so each composing model is ready before its caller.
LOAD_ORDER = (TRTLLM_MODEL, "preprocessing", "postprocessing", "tensorrt_llm_bls", "ensemble")


def slug(name: str) -> str:
    """A served name as a Triton model-name prefix: characters other than letters, digits, ``_.-`` become ``_``.

    Arguments:
        name: the served name (e.g. ``builtin:tiny-llama`` or ``org/model``).
    """
    return TRITON_NAME.sub("_", name).strip("_") or "model"


@dataclass
class Copied:
    """One output's models in the merged repository: original name → Triton name (shared ones included)."""

    names: dict[str, str] = field(default_factory=dict)

    def name(self, model: str) -> str:
        """The Triton name of the output's model ``model`` (as built)."""
        return self.names[model]

    def ordered(self) -> list[str]:
        """The Triton names in load order (composing models first)."""
        rank = {m: i for i, m in enumerate(LOAD_ORDER)}
        return [self.names[m] for m in sorted(self.names, key=lambda m: rank.get(m, -1))]


def copy_models(repo: Path, into: Path, prefix: str, shared: dict[str, str] | None = None) -> Copied:
    """Copy every model of ``repo`` into ``into`` as ``prefix + name``, rewriting the names it refers to.

    A model of ``SHARABLE`` whose directory is byte-identical to one already copied (``shared``: content digest →
    Triton name, updated here) is not copied again: this output's references point at the first copy.

    Arguments:
        repo: an artifact's ``repo/``; into: the merged repository; prefix: ``""`` keeps the names as built.
        shared: digests of the pre/postprocessing copies made so far (None: share nothing).
    """
    models = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file() and
                    (not prefix or p.name != "tensorrt_llm_bls" or _names_models(p)))
    copied = Copied()
    for model in models:
        copied.names[model] = prefix + model
        if shared is None or model not in SHARABLE:
            continue
        key = f"{model}:{_digest(repo / model)}"
        copied.names[model] = shared.setdefault(key, prefix + model)
    for model in models:
        target = into / copied.names[model]
        if target.exists() and copied.names[model] != prefix + model:
            continue  # a shared copy made for an earlier output
        if target.exists():
            raise KitUsageError(f"two served models would both be named {target.name} in {into}; give them "
                                "distinct names with --name NAME=OUT.")
        shutil.copytree(repo / model, target, symlinks=False)
        if prefix:
            _rename(target / "config.pbtxt", copied)
    return copied


def _rename(path: Path, copied: Copied) -> None:
    """Rewrite the config at ``path``: its name, its ensemble steps and its BLS parameters."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(path.read_text(), mc.ModelConfig())
    config.name = path.parent.name
    for step in config.ensemble_scheduling.step:
        step.model_name = copied.names.get(step.model_name, step.model_name)
    if config.name.endswith("tensorrt_llm_bls"):
        for key, built in BLS_PARAMETERS.items():
            referred = config.parameters[key].string_value or built if key in config.parameters else built
            config.parameters[key].string_value = copied.names.get(referred, referred)
    path.write_text(text_format.MessageToString(config))


def _names_models(bls: Path) -> bool:
    """Whether a BLS model takes the names of the models it calls as parameters (builds before that could not be
    renamed: a merged repository leaves them out, and their route uses the ensemble)."""
    return any("preprocessing_model_name" in p.read_text(errors="replace") for p in bls.glob("*/model.py"))


def _digest(directory: Path) -> str:
    """sha256 over the relative paths and bytes of every file in ``directory``."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def remove_models(into: Path, names: list[str]) -> None:
    """Delete the copies of ``names`` from the merged repository ``into``.

    Arguments:
        into: the merged repository; names: Triton model names.
    """
    for name in names:
        shutil.rmtree(into / name, ignore_errors=True)
