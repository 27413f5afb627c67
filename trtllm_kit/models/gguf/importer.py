"""The import stage: a GGUF file to a Hugging Face model directory in the kit's cache, written once per file.

The directory is named by the file's sha256 and the import's own version, so a changed file or a changed import
writes a new one and an unchanged one is reused; the digest is remembered with the file's size, mtime and inode, so
an unchanged file is not hashed again. The header is read and checked (architecture, tensor types,
tokenizer) before the file is hashed or anything is written; the weights are then written tensor by tensor, so
memory follows the largest tensor. ``gguf_import.json`` in the directory records where it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.errors import ModelError
from trtllm_kit.models.cache_dir import cache_root, cached_dir
from trtllm_kit.models.gguf.config import gguf_architecture, hf_config
from trtllm_kit.models.gguf.header import GGUFHeader, read_header
from trtllm_kit.models.gguf.tensor_data import check_types, output_dtype
from trtllm_kit.models.gguf.tokenizer import GGUFTokenizer, read_tokenizer, write_tokenizer_files
from trtllm_kit.models.gguf.weights import hf_tensors, planned_tensors
from trtllm_kit.safetensors_io import SafetensorsWriter

IMPORT_VERSION = 1  # bump whenever what the import writes changes
IMPORT_RECORD = "gguf_import.json"
WEIGHTS_FILE = "model.safetensors"
GGUF_SUFFIX = ".gguf"
HASH_CHUNK = 1 << 22


@dataclass(frozen=True)
class GGUFImport:
    """An imported GGUF file: the file, its sha256 and the Hugging Face directory written from it."""

    source: Path
    sha256: str
    model_dir: Path


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix, or by its first four bytes for a regular file)."""
    if path.suffix.lower() == GGUF_SUFFIX:
        return True
    try:
        if not path.is_file():
            return False
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def sha256_of(path: Path) -> str:
    """The file's sha256, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def import_gguf(path: Path) -> GGUFImport:
    """The Hugging Face directory of a llama-family GGUF file, imported into the cache on first use.

    Arguments:
        path: the GGUF file.
    """
    try:
        import gguf  # noqa: F401  (dequantization, type tables)
    except ImportError:
        raise ModelError(f"{path} is a GGUF file, and reading GGUF needs the gguf package: pip install "
                         "'trtllm-kit[gguf]'.") from None
    known = known_digest(path)
    if known is not None and import_dir(path, known).is_dir():
        return GGUFImport(path, known, import_dir(path, known))
    header = read_header(path)
    gguf_architecture(header)
    check_types(header)
    tokenizer = read_tokenizer(header)
    digest = sha256_of(path)
    final = cached_dir(import_dir(path, digest), lambda directory: write_import(header, tokenizer, directory, digest),
                       f"the import of {path.name}")
    remember_digest(path, digest)
    return GGUFImport(path, digest, final)


def import_dir(path: Path, digest: str) -> Path:
    """Where the import of the file ``path`` with sha256 ``digest`` lives in the cache."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem)[:64] or "model"
    return cache_root() / "gguf" / f"{stem}-{digest[:16]}-v{IMPORT_VERSION}"


def _fingerprint_file(path: Path) -> tuple[Path, list[int]]:
    """The cache file remembering ``path``'s digest, and the file's size, mtime and inode now."""
    resolved = path.resolve()
    info = resolved.stat()
    name = hashlib.sha256(str(resolved).encode()).hexdigest()[:24]
    return cache_root() / "gguf" / "digests" / f"{name}.json", [info.st_size, info.st_mtime_ns, info.st_ino]


def known_digest(path: Path) -> str | None:
    """The sha256 an earlier import took of ``path``, when the file's size, mtime and inode are still those it had
    then (as the build reuses its inputs' digests); None otherwise."""
    try:
        memo, now = _fingerprint_file(path)
        recorded = json.loads(memo.read_text())
    except (OSError, ValueError):
        return None
    return recorded.get("sha256") if recorded.get("fingerprint") == now else None


def remember_digest(path: Path, digest: str) -> None:
    """Record ``path``'s sha256 with its fingerprint for ``known_digest`` (best effort: a read-only cache only
    costs the next import a hash)."""
    with contextlib.suppress(OSError):
        memo, now = _fingerprint_file(path)
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(path.resolve()), "fingerprint": now, "sha256": digest}) + "\n")
        os.replace(tmp, memo)


def write_import(header: GGUFHeader, tokenizer: GGUFTokenizer, model_dir: Path, digest: str) -> None:
    """Write ``config.json``, ``model.safetensors``, the tokenizer files and ``gguf_import.json``.

    Arguments:
        header: the checked header; tokenizer: its tokenizer; model_dir: an empty directory; digest: the file's
        sha256, for the record.
    """
    embed = header.tensors["token_embd.weight"]
    config = hf_config(header, output_dtype(embed.type_code), {k: tokenizer.special_ids[k] for k in
                                                               ("bos_token_id", "eos_token_id", "pad_token_id")})
    if len(tokenizer.tokens) > config["vocab_size"]:
        raise ModelError(f"{header.path} has {len(tokenizer.tokens)} tokens but an embedding of {config['vocab_size']} "
                         "rows; the file is damaged: download or convert it again.")
    planned = planned_tensors(header, config)
    entries = [(name, output_dtype(t.type_code), t.shape) for t, name in planned]
    fd = os.open(header.path, os.O_RDONLY)
    try:
        with SafetensorsWriter(model_dir / WEIGHTS_FILE, entries, metadata={"format": "pt"}) as writer:
            for name, values in hf_tensors(header, gguf_architecture(header), config, fd):
                writer.write(name, values.contiguous())
    finally:
        os.close(fd)
    write_tokenizer_files(tokenizer, model_dir, config["max_position_embeddings"])
    record = {"source": str(header.path), "sha256": digest, "import_version": IMPORT_VERSION,
              "gguf_version": header.version, "architecture": header.architecture}
    for name, content in (("config.json", config), (IMPORT_RECORD, record)):
        (model_dir / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    for path in model_dir.iterdir():
        path.chmod(0o644)
