"""Item 10: archives with links or escaping names, symlinks in an artifact, a corrupt stage reused by the cache,
and a tampered artifact given to serve are all refused, each naming the file."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from reliability_helpers import MODEL, error_line, kit

from trtllm_kit.artifact.archive import pack_archive

pytestmark = pytest.mark.slow

TAIL = ("; archives made by --archive hold only regular files with relative names: the archive was crafted or "
        "corrupted, do not extract it.")


def crafted(good: Path, path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    """``good`` with ``member`` appended."""
    with tarfile.open(good) as source, tarfile.open(path, "w") as tar:
        for info in source:
            tar.addfile(info, source.extractfile(info))
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    return info


@pytest.fixture(scope="module")
def good_archive(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny artifact packed as ``--archive`` packs it; ``artifact verify`` accepts it (checked once here: every
    crafted archive below is this one with one member appended)."""
    good = pack_archive(tiny_artifact, tmp_path_factory.mktemp("archive") / "good.tar")
    assert kit("artifact", "verify", str(good)).returncode == 0
    return good


@pytest.mark.parametrize(("info", "shown"), [
    (member("tokenizer/vocab.json", tarfile.SYMTYPE, "/etc/passwd"),
     "tokenizer/vocab.json -> /etc/passwd, a symlink"),
    (member("tokenizer/copy.json", tarfile.LNKTYPE, "../../etc/shadow"),
     "tokenizer/copy.json -> ../../etc/shadow, a hard link"),
    (member("/etc/cron.d/job", data=b"x"), "/etc/cron.d/job, an absolute path"),
    (member("repo/../../escape.py", data=b"x"), "repo/../../escape.py, a path that leaves the artifact"),
    (member("checkpoint/config.json", data=b"{}"), "checkpoint/config.json, a second member of that name"),
    (member("repo/evil", tarfile.DIRTYPE), "repo/evil, not a regular file"),
], ids=["symlink", "hardlink", "absolute", "dotdot", "duplicate", "directory"])
def test_artifact_verify_refuses_a_crafted_archive(good_archive: Path, tmp_path: Path, info: tarfile.TarInfo,
                                                   shown: str) -> None:
    bad = crafted(good_archive, tmp_path / "bad.tar", info, b"x" * info.size)
    done = kit("artifact", "verify", str(bad))
    assert done.returncode == 1
    assert error_line(done) == f"{bad} holds {shown}{TAIL}"


def test_artifact_verify_refuses_a_symlink_in_a_directory(artifact_copy: Path, tmp_path: Path) -> None:
    same = tmp_path / "tokenizer.json"
    (artifact_copy / "tokenizer" / "tokenizer.json").rename(same)
    (artifact_copy / "tokenizer" / "tokenizer.json").symlink_to(same)  # same bytes, so its sha256 matches
    done = kit("artifact", "verify", str(artifact_copy))
    assert done.returncode == 1
    assert error_line(done) == (f"{artifact_copy} holds a symlink, tokenizer/tokenizer.json -> {same}; an artifact "
                                "holds only regular files: rebuild it or fetch it again.")


def flip_byte(path: Path, offset: int) -> None:
    """Flip one byte in place and put the file's times back, as bit rot would."""
    before = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_the_stage_cache_does_not_reuse_a_corrupt_checkpoint(artifact_copy: Path) -> None:
    rank = artifact_copy / "checkpoint" / "rank0.safetensors"
    original = rank.read_bytes()
    flip_byte(rank, len(original) // 2)
    done = kit("build", MODEL, "--no-verify", "--instances", "1", "--out", str(artifact_copy))
    assert done.returncode == 0, done.stderr
    assert ("checkpoint: checkpoint/rank0.safetensors of the previous build differs from its manifest (sha256); "
            "building it again") in " ".join(done.stderr.split())
    assert rank.read_bytes() == original
    assert kit("artifact", "verify", str(artifact_copy)).returncode == 0


def test_serve_refuses_a_file_of_another_size(artifact_copy: Path) -> None:
    model_py = artifact_copy / "repo" / "preprocessing" / "1" / "model.py"
    size = model_py.stat().st_size
    with model_py.open("a") as f:
        f.write("import os; os.system('id')\n")
    done = kit("serve", str(artifact_copy), "--tritonserver", "/nonexistent")
    assert done.returncode == 1
    assert error_line(done) == (f"{artifact_copy} does not match its manifest: repo/preprocessing/1/model.py changed "
                                f"(size {size} → {size + 27} bytes); the artifact was modified after it was built: "
                                f"rebuild it (trtllm-kit build ... --out {artifact_copy}) or fetch it again.")


def test_serve_refuses_a_model_added_to_the_repository(artifact_copy: Path) -> None:
    (artifact_copy / "repo" / "extra" / "1").mkdir(parents=True)
    (artifact_copy / "repo" / "extra" / "config.pbtxt").write_text('backend: "python"\n')
    (artifact_copy / "repo" / "extra" / "1" / "model.py").write_text("")
    done = kit("serve", str(artifact_copy), "--tritonserver", "/nonexistent")
    assert done.returncode == 1
    assert error_line(done).startswith(f"{artifact_copy} does not match its manifest: repo/extra/1/model.py is not in "
                                       "the manifest; repo/extra/config.pbtxt is not in the manifest; the artifact")


def test_serve_verify_hashes_what_sizes_and_times_miss(artifact_copy: Path) -> None:
    flip_byte(artifact_copy / "checkpoint" / "rank0.safetensors", 4096)
    done = kit("serve", str(artifact_copy), "--verify", "--tritonserver", "/nonexistent")
    assert done.returncode == 1
    assert error_line(done).startswith(f"{artifact_copy} does not match its manifest: checkpoint/rank0.safetensors "
                                       "changed (its sha256 differs from the manifest); the artifact was modified")
    plain = kit("serve", str(artifact_copy), "--tritonserver", "/nonexistent")
    assert "does not match its manifest" not in plain.stderr  # same size and time: found only by --verify
