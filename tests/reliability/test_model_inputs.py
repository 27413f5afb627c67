"""Item 9: no file from outside the model reaches an artifact, whatever links or index entries say."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from reliability_helpers import MODEL, error_line, kit, leftovers

from trtllm_kit.models.builtin import builtin_dir


def model_copy(tmp_path: Path) -> Path:
    source = builtin_dir(MODEL.removeprefix("builtin:"))
    model = tmp_path / "model"
    shutil.copytree(source, model)
    return model


def test_a_tokenizer_file_linked_to_a_secret_is_refused(tmp_path: Path) -> None:
    model = model_copy(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:hunter2\n")
    (model / "special_tokens_map.json").unlink()
    (model / "special_tokens_map.json").symlink_to(secret)
    out = tmp_path / "out"
    done = kit("build", str(model), "--until", "checkpoint", "--no-verify", "--out", str(out))
    assert done.returncode == 2
    assert error_line(done) == (f"{model}: special_tokens_map.json resolves to {secret}, outside the model directory "
                                f"{model}; the kit reads no file from outside a model: replace it with the file "
                                "itself.")
    assert not out.exists() and leftovers(tmp_path) == []


def test_an_index_entry_that_leaves_the_model_is_refused(tmp_path: Path) -> None:
    model = model_copy(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (model / "model.safetensors").rename(elsewhere / "x.safetensors")
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "../elsewhere/x.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    done = kit("inspect", str(model))
    assert done.returncode == 2
    assert error_line(done) == (f"{model}: ../elsewhere/x.safetensors resolves to {elsewhere / 'x.safetensors'}, "
                                f"outside the model directory {model}; the kit reads no file from outside a model: "
                                "replace it with the file itself.")


def hub_snapshot(hub: Path, model: Path, repo: str = "org/tiny") -> Path:
    """Lay ``model`` out as the HF hub cache does: blobs named by content, a snapshot of relative links."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True)
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(model.iterdir())):
        blob = folder / "blobs" / f"blob{i}"
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(Path("../../blobs") / blob.name)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_a_hub_cache_snapshot_links_into_its_own_blobs(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path / "hub", model_copy(tmp_path))
    out = tmp_path / "out"
    done = kit("build", "org/tiny", "--until", "checkpoint", "--no-verify", "--out", str(out),
               env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 0, done.stderr
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (snapshot / "tokenizer.json").read_bytes()
    assert not (out / "tokenizer" / "tokenizer.json").is_symlink()

    secret = tmp_path / "secret.txt"
    secret.write_text("token=abc\n")
    (snapshot / "tokenizer_config.json").unlink()
    (snapshot / "tokenizer_config.json").symlink_to(secret)
    done = kit("build", "org/tiny", "--until", "checkpoint", "--no-verify", "--out", str(tmp_path / "out2"),
               env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 2
    folder = (tmp_path / "hub" / "models--org--tiny").resolve()
    assert error_line(done) == (f"{snapshot}: tokenizer_config.json resolves to {secret}, outside the model "
                                f"directory {folder}; the kit reads no file from outside a model: replace it with "
                                "the file itself.")
