"""Every bad input gives one ``Error:`` sentence, the right exit code, and leaves nothing behind.

Each case runs the real CLI (``trtllm_kit.cli.run``) in process, except the signal tests, which run the
installed ``trtllm-kit`` script as a subprocess on a ~500 MB synthetic Llama and interrupt it mid-conversion.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.cli import run

SUPPORTED = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Phi3ForCausalLM"
PREVIOUS = "previous build, must survive a failed one\n"
BIG_LAYERS = 4


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32 HF Llama: H=64, 4 heads, 2 KV heads, I=128, 3 layers, vocab 67."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         num_hidden_layers=3, vocab_size=67, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def copy_model(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def edit_config(model_dir: Path, **changes: object) -> None:
    """Set keys of ``config.json``; a value of ``None`` deletes the key."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def edit_weights(model_dir: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def build(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(["build", *argv, "--no-verify"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("Error:")]


def leftovers(out: Path) -> list[str]:
    """Staging (``.out.*.partial``) or replaced (``.out.*.old``) siblings of ``out``."""
    return sorted(p.name for p in out.parent.glob(f".{out.name}.*"))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- the bad inputs --------------------------------------------------------------------------------------
# Each maker turns a copy of the tiny model into one bad input and returns (MODEL argument, extra flags,
# the exact error message).

Case = tuple[str, list[str], str]


def missing_path(model: Path, tmp: Path) -> Case:
    path = tmp / "no-such-model"
    return str(path), [], (f"{path} does not exist; give a Hugging Face model directory, a GGUF file, a repo id "
                           "present in the local HF cache, or a built-in model (see `trtllm-kit models`).")


def model_is_a_file(model: Path, tmp: Path) -> Case:
    path = model / "config.json"
    return str(path), [], (f"{path} is a file; point the kit at the model directory that holds config.json, or at "
                           "a .gguf file.")


def no_config(model: Path, tmp: Path) -> Case:
    (model / "config.json").unlink()
    return str(model), [], f"{model} has no config.json; point the kit at a Hugging Face model directory."


def truncated(model: Path, tmp: Path) -> Case:
    path = model / "model.safetensors"
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    path.write_bytes(data[:len(data) // 2])
    described, held = len(data) - 8 - header_len, len(data) // 2 - 8 - header_len
    return str(model), [], (f"{path} is truncated: its header describes {described} bytes of data but the file "
                            f"holds {held}; download or copy it again.")


def crafted_header(edit: Callable[[dict], object], message: str) -> Callable[[Path, Path], Case]:
    """A case whose model.safetensors keeps its data under a header that ``edit`` changed (``edit`` may return
    the raw header bytes to write instead); ``message`` names the file as ``{path}``, its data size ``{held}``."""
    def maker(model: Path, tmp: Path) -> Case:
        path = model / "model.safetensors"
        data = path.read_bytes()
        (header_len,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + header_len])
        raw = edit(header)
        head = raw if isinstance(raw, bytes) else json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + header_len:])
        return str(model), [], message.format(path=path, held=len(data) - 8 - header_len)
    return maker


def _first(header: dict) -> dict:
    return header[min(k for k in header if k != "__metadata__")]


def _overlap(header: dict) -> None:
    norms = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"
    header[norms[1]]["data_offsets"] = header[norms[0]]["data_offsets"]  # same shape: the same bytes twice


def huge_header_length(model: Path, tmp: Path) -> Case:
    path = model / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 2**63) + data[8:])
    return str(model), [], (f"{path} is truncated or not a safetensors file (header of {2**63} bytes in a file of "
                            f"{len(data)}).")


def entry_bomb(model: Path, tmp: Path) -> Case:
    """400,000 entries (36 MB of header): refused by its length, before any JSON is parsed."""
    path = model / "model.safetensors"
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    entry = '"t{}":{{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    head = ("{" + ",".join(entry.format(i) for i in range(400_000)) + "}").encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + header_len:])
    return str(model), [], (f"{path} has a safetensors header of {len(head):,} bytes, over the kit's bound of "
                            "16,777,216 (real shards hold a few thousand entries); it is not read. Re-save the "
                            "checkpoint in smaller shards.")


CRAFTED = "{path} has a corrupt safetensors header: "
CRAFTED_HEADERS = [
    ("header-length-beyond-the-file", huge_header_length),
    ("header-of-400k-entries", entry_bomb),
    ("header-not-json", crafted_header(lambda h: b"{not json" + b" " * 40,
                                       CRAFTED + "it is not JSON.")),
    ("header-a-list", crafted_header(lambda h: b"[1, 2, 3]", CRAFTED + "a JSON list, not an object of tensors.")),
    ("offsets-beyond-the-data", crafted_header(
        lambda h: _first(h).update(data_offsets=[0, 10**12]),
        "{path} is truncated: its header describes 1000000000000 bytes of data but the file holds {held}; "
        "download or copy it again.")),
    ("offsets-reversed", crafted_header(
        lambda h: _first(h).update(data_offsets=[8, 4]),
        CRAFTED + "tensor 'lm_head.weight' has data_offsets [8, 4]; they are [begin, end] with 0 <= begin <= end.")),
    ("wrong-dtype-string", crafted_header(
        lambda h: _first(h).update(dtype="F33"),
        CRAFTED + "tensor 'lm_head.weight' has dtype 'F33', which is not a safetensors dtype (BOOL, U8, I8, F8_E5M2, "
                  "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64).")),
    ("shape-not-a-list", crafted_header(
        lambda h: _first(h).update(shape="big"),
        CRAFTED + "tensor 'lm_head.weight' has shape 'big'; a shape is a list of non-negative integers.")),
    ("size-disagrees-with-shape", crafted_header(
        lambda h: _first(h).update(shape=[67, 65]),
        CRAFTED + "tensor 'lm_head.weight' spans 17152 bytes but its F32 shape [67, 65] needs 17420.")),
    ("overlapping-offsets", crafted_header(
        _overlap, CRAFTED + "the data of tensors 'model.layers.0.input_layernorm.weight' and "
                            "'model.layers.0.post_attention_layernorm.weight' overlap.")),
]


def missing_tensor(model: Path, tmp: Path) -> Case:
    edit_weights(model, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    return str(model), [], (f"{model}: tensor model.layers.1.mlp.up_proj.weight is missing from the weights; the "
                            "checkpoint is incomplete or does not match its config.json.")


def wrong_shape(model: Path, tmp: Path) -> Case:
    edit_weights(model, lambda t: t.update({"model.layers.2.self_attn.k_proj.weight": torch.zeros(48, 64)}))
    return str(model), [], ("model.safetensors: tensor model.layers.2.self_attn.k_proj.weight has shape [48, 64], "
                            "but config.json implies [32, 64]; the weights and config do not match.")


def no_model_type(model: Path, tmp: Path) -> Case:
    edit_config(model, model_type=None)
    return str(model), [], (f"{model / 'config.json'} has no 'model_type' key; this is not a Hugging Face model "
                            "config (point the kit at the directory that holds the model's config.json).")


def gpt2(model: Path, tmp: Path) -> Case:
    edit_config(model, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    return str(model), [], (f"{model} is a GPT2LMHeadModel, which the kit does not convert; supported "
                            f"architectures: {SUPPORTED}.")


def phi_without_architectures(model: Path, tmp: Path) -> Case:
    edit_config(model, model_type="phi", architectures=None)
    return str(model), [], (f"{model} is a model_type 'phi', which the kit does not convert; supported "
                            f"architectures: {SUPPORTED}.")


def remote_code(model: Path, tmp: Path) -> Case:
    edit_config(model, auto_map={"AutoConfig": "configuration_x.XConfig",
                                 "AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    return str(model), [], (f"{model / 'config.json'} needs remote code (auto_map: ['AutoConfig', "
                            "'AutoModelForCausalLM']); the kit never runs trust_remote_code models: convert it to "
                            "a supported architecture first.")


def heads_not_divisible(model: Path, tmp: Path) -> Case:
    return str(model), ["--tp", "3"], ("num_attention_heads 4 is not divisible by tp_size 3; choose a tp_size "
                                       "that divides 4.")


def pp_over_layers(model: Path, tmp: Path) -> Case:
    return str(model), ["--pp", "4"], "pp_size 4 is larger than the model's 3 layers; choose pp_size <= 3."


def pickle_only(model: Path, tmp: Path) -> Case:
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    return str(model), [], (f"{model} has only pickle weights (pytorch_model.bin); pickle can run code when "
                            "loaded, so the kit refuses it: convert to safetensors or pass --allow-pickle.")


def set_weight(model_dir: Path, name: str, index: tuple[int, int], value: float) -> None:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name][index] = value

    edit_weights(model_dir, edit)


def poisoned(value: float) -> Callable[[Path, Path], Case]:
    def make(model: Path, tmp: Path) -> Case:
        set_weight(model, "model.layers.2.self_attn.o_proj.weight", (3, 5), value)
        nan, inf = (1, 0) if value != value else (0, 1)
        return str(model), [], (f"HF tensor model.layers.2.self_attn.o_proj.weight holds {nan} NaN and {inf} "
                                "infinite value(s), the first at index (3, 5); the weights are corrupt, so the kit "
                                "refuses to build from them.")
    return make


def float16_overflow(model: Path, tmp: Path) -> Case:
    set_weight(model, "model.layers.0.mlp.down_proj.weight", (7, 9), -1.5e5)
    return str(model), [], ("HF tensor model.layers.0.mlp.down_proj.weight overflows float16 (max |w| = 1.5e+05); "
                            "convert with --dtype bfloat16 or float32.")


def repo_id_not_cached(model: Path, tmp: Path) -> Case:
    searched = Path(os.environ["HF_HOME"]) / "hub" / "models--acme--llama-nano"
    return "acme/llama-nano", [], (f"acme/llama-nano is not in the local Hugging Face cache (searched {searched}); "
                                   "the kit never downloads: fetch it first (huggingface-cli download) or pass a "
                                   "local directory.")


BAD_INPUTS = [
    # (id, maker, exit code)
    ("missing-path", missing_path, 2),
    ("model-is-a-file", model_is_a_file, 2),
    ("no-config", no_config, 2),
    ("truncated-safetensors", truncated, 1),
    ("missing-tensor", missing_tensor, 1),
    ("wrong-shape", wrong_shape, 1),
    ("no-model-type", no_model_type, 2),
    ("unsupported-gpt2", gpt2, 2),
    ("unsupported-phi-model-type", phi_without_architectures, 2),
    ("remote-code", remote_code, 2),
    ("heads-not-divisible-by-tp", heads_not_divisible, 2),
    ("pp-over-layers", pp_over_layers, 2),
    ("pickle-only", pickle_only, 2),
    ("nan-weight", poisoned(float("nan")), 1),
    ("inf-weight", poisoned(float("-inf")), 1),
    ("float16-overflow", float16_overflow, 1),
    ("repo-id-not-cached", repo_id_not_cached, 2),
    *((name, maker, 1) for name, maker in CRAFTED_HEADERS),
]


@pytest.mark.parametrize("previous", [False, True], ids=["no-out-yet", "out-exists-with-force"])
@pytest.mark.parametrize(("maker", "exit_code"), [pytest.param(m, c, id=i) for i, m, c in BAD_INPUTS])
def test_bad_input(maker: Callable[[Path, Path], Case], exit_code: int, previous: bool, tiny_llama: Path,
                   tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    model, flags, message = maker(copy_model(tiny_llama, tmp_path / "model"), tmp_path)
    out = tmp_path / "out"
    if previous:
        out.mkdir()
        (out / "manifest.json").write_text(PREVIOUS)
        flags = [*flags, "--force"]

    code, stdout, err = build(capsys, model, "--out", str(out), *flags)

    assert (code, error_lines(err)) == (exit_code, [f"Error: {message}"])
    assert "Traceback" not in err
    assert stdout == ""
    assert snapshot(out) == ({"manifest.json": PREVIOUS.encode()} if previous else {})
    assert out.is_dir() is previous
    assert leftovers(out) == []


def test_float16_overflow_builds_with_the_suggested_dtype(tiny_llama: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    model, _, _ = float16_overflow(copy_model(tiny_llama, tmp_path / "model"), tmp_path)
    code, _, err = build(capsys, model, "--out", str(tmp_path / "out"), "--dtype", "bfloat16")
    assert (code, error_lines(err)) == (0, [])
    config = json.loads((tmp_path / "out" / "checkpoint" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"


def test_allow_pickle_gives_the_same_checkpoint_as_safetensors(tiny_llama: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    model, _, _ = pickle_only(copy_model(tiny_llama, tmp_path / "model"), tmp_path)
    layout = ["--tp", "2", "--pp", "2"]

    from_pickle = build(capsys, model, "--out", str(tmp_path / "pickle"), "--allow-pickle", *layout)
    from_safetensors = build(capsys, str(tiny_llama), "--out", str(tmp_path / "safetensors"), *layout)

    assert (from_pickle[0], from_safetensors[0]) == (0, 0)
    checkpoint = snapshot(tmp_path / "pickle" / "checkpoint")
    assert sorted(checkpoint) == ["config.json", *(f"rank{r}.safetensors" for r in range(4))]
    assert checkpoint == snapshot(tmp_path / "safetensors" / "checkpoint")
    manifest = json.loads((tmp_path / "pickle" / "manifest.json").read_text())
    assert sorted(manifest["inputs"]) == ["config.json", "pytorch_model.bin"]
    assert manifest["spec"]["build"]["allow_pickle"] is True


def test_repo_id_found_in_the_hf_cache_by_refs_main(tiny_llama: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub layout: blobs, snapshots/<rev>/ of symlinks, refs/main naming the revision to use."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    repo = tmp_path / "hf" / "hub" / "models--acme--llama-nano"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snapshot_dir = repo / "snapshots" / rev
    snapshot_dir.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, file in enumerate(sorted(tiny_llama.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(file, blob)
        (snapshot_dir / file.name).symlink_to(os.path.relpath(blob, snapshot_dir))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev + "\n")
    time.sleep(0.01)
    (repo / "snapshots" / "fedcba9876543210fedcba9876543210fedcba98").mkdir()  # newer, but not refs/main

    out = tmp_path / "out"
    code = run(["build", "acme/llama-nano", "--out", str(out), "--no-verify", "--json"])
    stdout = capsys.readouterr().out

    assert code == 0
    summary = json.loads(stdout)
    assert summary["model"]["path"] == str(snapshot_dir)
    assert summary["model"]["source"] == "acme/llama-nano"
    assert (out / "checkpoint" / "rank0.safetensors").is_file()


# --- the output directory --------------------------------------------------------------------------------


def test_non_empty_out_is_refused_without_force(tiny_llama: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "keep.txt").write_text("mine")
    (out / "sub" / "deep.txt").write_text("also mine")

    code, _, err = build(capsys, str(tiny_llama), "--out", str(out))

    assert (code, error_lines(err)) == (2, [f"Error: --out {out} is not empty (2 entries); pass --force to replace "
                                            "it or choose another directory."])
    assert snapshot(out) == {"keep.txt": b"mine", "sub/deep.txt": b"also mine"}
    assert leftovers(out) == []


def test_non_empty_out_is_replaced_with_force(tiny_llama: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")

    code, _, err = build(capsys, str(tiny_llama), "--out", str(out), "--force")

    assert (code, error_lines(err)) == (0, [])
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "manifest.json", "repo", "tokenizer"]
    assert leftovers(out) == []


def test_out_that_is_a_file_is_refused(tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.write_text("not a directory")

    code, _, err = build(capsys, str(tiny_llama), "--out", str(out), "--force")

    assert (code, error_lines(err)) == (2, [f"Error: --out {out} is a file; choose a directory path."])
    assert out.read_text() == "not a directory"
    assert leftovers(out) == []


def test_out_under_a_read_only_parent(tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        probe = parent / "probe"
        try:
            probe.mkdir()
        except PermissionError:
            pass
        else:
            pytest.skip("permission bits are not enforced for this user (root); see test_out_under_proc")
        out = parent / "out"
        code, _, err = build(capsys, str(tiny_llama), "--out", str(out))
        assert (code, error_lines(err)) == (2, [f"Error: --out {out} cannot be created: {parent} is not writable; "
                                                "choose a writable location."])
        assert list(parent.iterdir()) == []
    finally:
        parent.chmod(0o700)


@pytest.mark.parametrize(("out", "parent"), [
    ("/proc/self/trtllm-kit-out/nested", "/proc/self"), ("/proc/trtllm-kit-out", "/proc")])
def test_out_under_proc(out: str, parent: str, tiny_llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/proc cannot hold new directories, whatever os.access says (for root it says /proc is writable)."""
    code, _, err = build(capsys, str(tiny_llama), "--out", out)
    assert (code, error_lines(err)) == (2, [f"Error: --out {out} cannot be created: {parent} is not writable; "
                                            "choose a writable location."])
    assert not Path(out).exists()


# --- interrupting a real build ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~500 MB float32 Llama (H=1024, I=4096, 4 layers, vocab 32000) in index-sharded safetensors.

    Written tensor by tensor from a seeded generator (no transformers initialisation), one file per layer.
    """
    hidden, inter, heads, kv_heads, vocab = 1024, 4096, 16, 8, 32000
    kv = kv_heads * hidden // heads
    path = tmp_path_factory.mktemp("big") / "big-llama"
    path.mkdir()
    generator = torch.Generator().manual_seed(0)

    def normal(*shape: int) -> torch.Tensor:
        return torch.empty(shape).normal_(0.0, 0.02, generator=generator)

    weight_map: dict[str, str] = {}

    def write(file: str, tensors: dict[str, torch.Tensor]) -> None:
        save_file(tensors, path / file)
        weight_map.update(dict.fromkeys(tensors, file))

    write("model-embeddings.safetensors", {"model.embed_tokens.weight": normal(vocab, hidden),
                                           "lm_head.weight": normal(vocab, hidden),
                                           "model.norm.weight": torch.ones(hidden)})
    for layer in range(BIG_LAYERS):
        p = f"model.layers.{layer}"
        write(f"model-layer{layer}.safetensors", {
            f"{p}.input_layernorm.weight": torch.ones(hidden),
            f"{p}.post_attention_layernorm.weight": torch.ones(hidden),
            f"{p}.self_attn.q_proj.weight": normal(hidden, hidden),
            f"{p}.self_attn.k_proj.weight": normal(kv, hidden),
            f"{p}.self_attn.v_proj.weight": normal(kv, hidden),
            f"{p}.self_attn.o_proj.weight": normal(hidden, hidden),
            f"{p}.mlp.gate_proj.weight": normal(inter, hidden),
            f"{p}.mlp.up_proj.weight": normal(inter, hidden),
            f"{p}.mlp.down_proj.weight": normal(hidden, inter),
        })
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": BIG_LAYERS, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab, "torch_dtype": "float32"}))
    return path


def kit_command() -> list[str]:
    script = Path(sys.executable).with_name("trtllm-kit")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from trtllm_kit.cli import main; main()"]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_conversion_leaves_nothing(signum: int, big_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        [*kit_command(), "build", str(big_llama), "--out", str(out), "--tp", "2", "--no-verify"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell may ignore SIGINT
    try:
        deadline = time.monotonic() + 60
        while not any(tmp_path.glob(".out.*.partial/checkpoint/rank0.safetensors")):
            assert process.poll() is None, f"the build ended before it was interrupted: {process.communicate()}"
            assert time.monotonic() < deadline, "the staging directory never appeared"
            time.sleep(0.005)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)  # a hang guard only
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert (process.returncode, error_lines(stderr)) == (130, ["Error: interrupted; nothing was written."]), stderr
    assert "Traceback" not in stderr
    assert stdout == ""
    assert not out.exists()
    assert leftovers(out) == []


def interrupt_on(monkeypatch: pytest.MonkeyPatch, method: str, when: Callable[[Path], bool]) -> None:
    """Raise KeyboardInterrupt (what SIGINT does) from ``Path.<method>`` when ``when(path)`` holds."""
    original = getattr(Path, method)

    def interrupted(self: Path, *args: object, **kwargs: object) -> object:
        if when(self):
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, method, interrupted)


def test_interrupt_right_after_the_staging_dir_is_made(tiny_llama: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    interrupt_on(monkeypatch, "chmod", lambda path: path.name.endswith(".partial"))
    out = tmp_path / "out"
    code, _, err = build(capsys, str(tiny_llama), "--out", str(out))
    assert (code, error_lines(err)) == (130, ["Error: interrupted; nothing was written."])
    assert leftovers(out) == []


def test_interrupt_while_replacing_keeps_the_previous_out(tiny_llama: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(PREVIOUS)
    interrupt_on(monkeypatch, "rename", lambda path: path.name.endswith(".partial"))
    code, _, err = build(capsys, str(tiny_llama), "--out", str(out), "--force")
    assert (code, error_lines(err)) == (130, ["Error: interrupted; nothing was written."])
    assert snapshot(out) == {"manifest.json": PREVIOUS.encode()}
    assert leftovers(out) == []
