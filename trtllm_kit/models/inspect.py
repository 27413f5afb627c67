"""From what the user typed to a ``ModelSpec``: where the model is, what it is, which tensors it has."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_kit.errors import ModelError
from trtllm_kit.models.base import Family
from trtllm_kit.models.builtin import builtin_dir, builtin_origin
from trtllm_kit.models.gguf.importer import import_gguf, is_gguf_file
from trtllm_kit.models.hf_config import HFConfig, read_hf_config
from trtllm_kit.models.registry import family_for
from trtllm_kit.names import TOKENIZER_FILES
from trtllm_kit.safetensors_io import DTYPES_BY_CODE, read_layout

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class TensorInfo:
    """Where one HF tensor lives and what it is, read from the file header without loading data."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int | None = None  # where its bytes begin in a safetensors file (None: a pickle checkpoint)

    @property
    def nbytes(self) -> int:
        n = torch.empty((), dtype=self.dtype).element_size()
        for dim in self.shape:
            n *= dim
        return n


@dataclass(frozen=True)
class ModelSpec:
    """A local model the kit can convert."""

    source: str
    path: Path
    hf: HFConfig
    family: Family
    weight_format: str  # "safetensors" or "pickle"
    tensors: dict[str, TensorInfo]
    tokenizer_files: tuple[Path, ...]
    origin: Path | None = None  # the GGUF file ``path`` was imported from (hashed with the build's inputs)

    @property
    def weight_files(self) -> tuple[Path, ...]:
        return tuple(sorted({info.path for info in self.tensors.values()}))

    @property
    def weight_bytes(self) -> int:
        return sum(info.nbytes for info in self.tensors.values())


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache, as ``huggingface_hub`` finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def resolve_model_path(source: str) -> Path:
    """The local directory of a model: ``builtin:NAME``, a directory, a GGUF file (imported into the cache) or an
    HF repo id in the local cache.

    Arguments:
        source: what the user typed. Nothing is downloaded from a model hub.
    """
    if source.startswith("builtin:"):
        return builtin_dir(source.removeprefix("builtin:"))
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if is_gguf_file(path):
        return import_gguf(path).model_dir
    if path.exists():
        raise ModelError(f"{source} is a file; point the kit at the model directory that holds config.json, or at "
                         "a .gguf file.")
    if REPO_ID.match(source) and not source.startswith((".", "/")):
        return _cached_snapshot(source)
    raise ModelError(f"{source} does not exist; give a Hugging Face model directory, a GGUF file, a repo id present "
                     "in the local HF cache, or a built-in model (see `trtllm-kit models`).")


def model_origin(source: str) -> Path | None:
    """The GGUF file a model is imported from (a ``.gguf`` path, or a built-in model shipped as one), else None.

    Arguments:
        source: what the user typed.
    """
    if source.startswith("builtin:"):
        return builtin_origin(source.removeprefix("builtin:"))
    path = Path(source).expanduser()
    return path if not path.is_dir() and is_gguf_file(path) else None


def _cached_snapshot(repo_id: str) -> Path:
    cache = hf_cache_dir()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    candidates = sorted((p for p in snapshots.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if candidates:
        return candidates[-1]
    raise ModelError(f"{repo_id} is not in the local Hugging Face cache (searched {repo}); the kit never "
                     "downloads: fetch it first (huggingface-cli download) or pass a local directory.")


def model_root(model_dir: Path) -> Path:
    """The directory every file of a model must resolve into: the model directory itself, or for a hub-cache
    snapshot (``models--ORG--NAME/snapshots/REV``) that model's cache folder, whose ``blobs/`` the snapshot's
    symlinks point into by design.

    Arguments:
        model_dir: a local model directory.
    """
    resolved = model_dir.resolve()
    if model_dir.parent.name == "snapshots" and model_dir.parent.parent.name.startswith("models--"):
        return model_dir.parent.parent.resolve()
    return resolved


def check_inside(path: Path, model_dir: Path) -> Path:
    """``path`` if it resolves inside the model (``model_root``); a ``ModelError`` naming where it leads if not.

    Arguments:
        path: a file the kit is about to read (a link is followed to its target).
        model_dir: the model directory it belongs to.
    """
    root, target = model_root(model_dir), path.resolve()
    if not target.is_relative_to(root):
        shown = path.relative_to(model_dir) if path.is_relative_to(model_dir) else path
        raise ModelError(f"{model_dir}: {shown} resolves to {target}, outside the model directory {root}; the kit "
                         "reads no file from outside a model: replace it with the file itself.")
    return path


def _safetensors_index(model_dir: Path) -> dict[str, TensorInfo]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        check_inside(index, model_dir)
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({check_inside(model_dir / name, model_dir) for name in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise ModelError(f"{index} lists {file.name}, which is missing; the download is incomplete.")
    else:
        files = sorted(check_inside(p, model_dir) for p in model_dir.glob("*.safetensors"))
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        header, data_start = read_layout(file)
        for name, entry in header.items():
            if entry["dtype"] not in DTYPES_BY_CODE:
                raise ModelError(f"{file.name}: tensor {name} has dtype {entry['dtype']}, which the kit cannot read.")
            tensors[name] = TensorInfo(file, DTYPES_BY_CODE[entry["dtype"]], tuple(entry["shape"]),
                                       data_start + entry["data_offsets"][0])
    return tensors


def _pickle_files(model_dir: Path) -> list[Path]:
    return sorted(p for pattern in ("*.bin", "*.pt", "*.pth") for p in model_dir.glob(pattern))


def _pickle_index(files: list[Path]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
        for name, tensor in state.items():
            tensors[name] = TensorInfo(file, tensor.dtype, tuple(tensor.shape))
    return tensors


def inspect_model(source: str, *, allow_pickle: bool = False) -> ModelSpec:
    """Resolve, read and check a model without loading its weights.

    Arguments:
        source: a directory, a GGUF file, ``builtin:NAME`` or an HF repo id in the local cache.
        allow_pickle: accept ``.bin``/``.pt`` checkpoints (loaded with ``weights_only=True``).
    """
    path = resolve_model_path(source)
    check_inside(path / "config.json", path)
    hf = read_hf_config(path)
    family = family_for(hf, source)
    tensors = _safetensors_index(path)
    weight_format = "safetensors"
    if not tensors:
        pickles = _pickle_files(path)
        if not pickles:
            raise ModelError(f"{path} holds no weights (*.safetensors or *.bin); the model directory is incomplete.")
        if not allow_pickle:
            raise ModelError(f"{path} has only pickle weights ({pickles[0].name}); pickle can run code when "
                             "loaded, so the kit refuses it: convert to safetensors or pass --allow-pickle.")
        tensors, weight_format = _pickle_index([check_inside(p, path) for p in pickles]), "pickle"
    tokenizer = tuple(check_inside(path / name, path) for name in TOKENIZER_FILES if (path / name).exists())
    return ModelSpec(source, path, hf, family, weight_format, tensors, tokenizer, origin=model_origin(source))
