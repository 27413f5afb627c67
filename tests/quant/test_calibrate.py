"""Calibration: text sources and their errors, seeded windows, the hooks' statistics, saving and loading."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import transformers

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.tokenizer import corpus_path
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_data import data_sha256, read_texts, sample_windows, token_windows
from trtllm_kit.quant.calibrate import CalibrationStats, calibrate

torch.set_num_threads(1)


def test_default_texts_are_the_shipped_corpus() -> None:
    texts = read_texts(None)
    assert texts == [line for line in corpus_path().read_text().splitlines() if line.strip()]


def test_txt_and_jsonl(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first line\n\n  \nsecond line\n")
    assert read_texts(tmp_path / "a.txt") == ["first line", "second line"]
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n')
    assert read_texts(tmp_path / "b.jsonl") == ["one", "two"]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("empty.txt", "\n  \n", "--calib-data {path} holds no text; calibration needs at least one non-empty line."),
    ("empty.jsonl", '{"text": ""}\n', "--calib-data {path} holds no text; calibration needs at least one non-empty "
                                     "line."),
    ("bad.jsonl", '{"text": "a"}\nnot json\n', "--calib-data {path}: line 2 is not JSON (Expecting value); each "
                                               "line must be an object with a \"text\" string."),
    ("field.jsonl", '{"body": "a"}\n', "--calib-data {path}: line 1 has no \"text\" string; each line must be an "
                                      "object with a \"text\" string."),
    ("data.csv", "a,b\n", "--calib-data {path} has the suffix '.csv'; pass a .txt file (one text per line) or a "
                         ".jsonl file with a \"text\" field per line."),
    ("missing.txt", None, "--calib-data {path} cannot be read (No such file or directory); pass a readable UTF-8 "
                          ".txt or .jsonl file."),
    ("binary.txt", b"\xff\xfe\x00bad", "--calib-data {path} cannot be read ('utf-8' codec can't decode byte 0xff "
                                       "in position 0: invalid start byte); pass a readable UTF-8 .txt or .jsonl "
                                       "file."),
])
def test_unusable_calibration_data_is_refused(tmp_path: Path, name: str, content: str | bytes | None,
                                              message: str) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(KitUsageError) as error:
        read_texts(path)
    assert str(error.value) == message.format(path=path)


def test_the_digest_of_a_file_that_cannot_be_read_is_refused_as_its_texts_are(tmp_path: Path) -> None:
    with pytest.raises(KitUsageError) as error:
        data_sha256(tmp_path / "missing.txt")
    assert str(error.value) == (f"--calib-data {tmp_path / 'missing.txt'} cannot be read (No such file or directory); "
                                "pass a readable UTF-8 .txt or .jsonl file.")
    (tmp_path / "a.txt").write_text("one\n")
    assert data_sha256(tmp_path / "a.txt") == hashlib.sha256(b"one\n").hexdigest()
    assert data_sha256(None) == hashlib.sha256(corpus_path().read_bytes()).hexdigest()


def test_windows_are_seeded_and_start_with_bos() -> None:
    stream = list(range(100, 200))
    first = sample_windows(stream, 5, 10, seed=7, bos_id=1)
    assert first == sample_windows(stream, 5, 10, seed=7, bos_id=1)
    assert first != sample_windows(stream, 5, 10, seed=8, bos_id=1)
    for window in first:
        assert len(window) == 10 and window[0] == 1
        assert window[1:] == list(range(window[1], window[1] + 9))  # consecutive tokens of the stream
    assert sample_windows(stream[:5], 5, 10, seed=7, bos_id=None) == [stream[:5]]  # short: one window


def test_token_windows_use_the_model_tokenizer(tiny: dict[str, Path]) -> None:
    windows = token_windows(tiny["tiny-llama"], QuantConfig(kv_cache="int8", calib_samples=3, calib_seq_len=32))
    assert [len(w) for w in windows] == [32, 32, 32]
    assert all(w[0] == 1 for w in windows)  # <s>


def test_hooks_record_per_channel_amax(tiny: dict[str, Path], stats: dict[str, CalibrationStats]) -> None:
    """The statistics equal what a plain forward pass over the same windows shows."""
    path = tiny["tiny-qwen2"]
    config = QuantConfig(quant="fp8", calib_samples=16, calib_seq_len=128, calib_dtype="float32")
    st = stats["tiny-qwen2"]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(token_windows(path, config))
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[1]  # after layer 0
        layer = model.model.layers[1]
        x = layer.input_layernorm(hidden)
        k = layer.self_attn.k_proj(x)
    torch.testing.assert_close(st.x["model.layers.1.self_attn.k_proj"], x.abs().amax((0, 1)))
    torch.testing.assert_close(st.y["model.layers.1.self_attn.k_proj"], k.abs().amax((0, 1)))  # bias included
    weight = layer.mlp.down_proj.weight
    assert torch.equal(st.w["model.layers.1.mlp.down_proj"], weight.abs().amax(1))
    assert torch.equal(st.wc["model.layers.1.mlp.down_proj"], weight.abs().amax(0))
    assert "lm_head" not in st.x
    assert st.params["num_windows"] == 16 and st.params["calib_seed"] == 1234


def test_stats_save_and_load(stats: dict[str, CalibrationStats], tmp_path: Path) -> None:
    st = stats["tiny-mistral"]
    st.save(tmp_path / "calibration")
    loaded = CalibrationStats.load(tmp_path / "calibration")
    for kind in ("x", "y", "w", "wc"):
        assert getattr(loaded, kind).keys() == getattr(st, kind).keys()
        assert all(torch.equal(getattr(loaded, kind)[k], v) for k, v in getattr(st, kind).items())
    assert json.loads((tmp_path / "calibration" / "calibration.json").read_text()) == st.params


def test_calibration_with_user_data(tiny: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"Sample number {i} about the weather."}) for i in range(20)))
    st = calibrate(tiny["tiny-mistral"], QuantConfig(kv_cache="fp8", calib_data=data, calib_samples=2,
                                                     calib_seq_len=16))
    assert st.params["calib_data"] == str(data) and st.params["num_tokens"] == 32
    assert len(st.x) == 3 * 7  # q, k, v, o, gate, up, down per layer; lm_head excluded
