"""Calibration tokenizes with ``tokenizer.json`` alone: the windows equal ``transformers.AutoTokenizer``'s, a
directory without ``tokenizer.json`` still works through transformers, and an unusable tokenizer is one sentence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_data import read_texts, sample_windows, token_windows

MODELS = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-phi3")
UNICODE_TEXT = "Crème brûlée, naïve café — 東京 😀\n  tabs\tand\r\nlines\n\nend   "


def oracle_windows(model_dir: Path, config: QuantConfig) -> list[list[int]]:
    """What transformers' tokenizer gives for the same texts (the stream, then the seeded windows)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    stream: list[int] = []
    for text in read_texts(config.calib_data):
        stream += tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            stream.append(tokenizer.eos_token_id)
    assert config.calib_samples is not None and config.calib_seq_len is not None
    return sample_windows(stream, config.calib_samples, config.calib_seq_len, config.calib_seed,
                          tokenizer.bos_token_id)


def unicode_data(tmp_path: Path) -> Path:
    path = tmp_path / "unicode.jsonl"
    path.write_text(json.dumps({"text": UNICODE_TEXT}) + "\n" + json.dumps({"text": "second\n\ntext"}) + "\n")
    return path


@pytest.mark.parametrize("name", MODELS)
def test_windows_equal_transformers(name: str, tmp_path: Path) -> None:
    model_dir = builtin_dir(name)
    assert (model_dir / "tokenizer.json").is_file()
    for data in (None, unicode_data(tmp_path)):
        config = QuantConfig(quant="fp8", calib_samples=8, calib_seq_len=48, calib_data=data)
        windows = token_windows(model_dir, config)
        assert windows == oracle_windows(model_dir, config)
        assert [len(w) for w in windows] == [48] * 8


def test_special_tokens_as_objects_and_from_the_map(tmp_path: Path) -> None:
    """``bos_token`` as ``{"content": ...}``, and ``eos_token`` only in ``special_tokens_map.json`` (older files:
    transformers 5 reads that file only where ``tokenizer_config.json`` has no ``added_tokens_decoder``)."""
    model_dir = tmp_path / "tok"
    shutil.copytree(builtin_dir("tiny-llama"), model_dir)
    config_path = model_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["bos_token"] = {"__type": "AddedToken", "content": "</s>", "lstrip": False,  # as older files
                                     "normalized": False, "rstrip": False, "single_word": False, "special": True}
    del tokenizer_config["eos_token"], tokenizer_config["added_tokens_decoder"]
    config_path.write_text(json.dumps(tokenizer_config))
    (model_dir / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<|user|>"}}))
    data = tmp_path / "short.txt"
    data.write_text("one\ntwo\n")
    config = QuantConfig(quant="fp8", calib_samples=4, calib_seq_len=32, calib_data=data)
    windows = token_windows(model_dir, config)
    assert len(windows) == 1 and windows[0][0] == 2  # </s> first
    assert windows[0].count(4) == 2  # <|user|> ends each text
    assert windows == oracle_windows(model_dir, config)


def test_a_directory_without_tokenizer_json_uses_transformers(tmp_path: Path) -> None:
    """vocab.json + merges.txt with Qwen2's pre-tokenizer: the same tokenizer, read by transformers."""
    source = builtin_dir("tiny-qwen2")
    model_dir = tmp_path / "slow"
    model_dir.mkdir()
    Tokenizer.from_file(str(source / "tokenizer.json")).model.save(str(model_dir))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(source / name, model_dir / name)
    config_path = model_dir / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "tokenizer_class": "Qwen2Tokenizer"}))
    assert sorted(p.name for p in model_dir.iterdir()) == ["merges.txt", "special_tokens_map.json",
                                                            "tokenizer_config.json", "vocab.json"]
    for data in (None, unicode_data(tmp_path)):
        config = QuantConfig(quant="fp8", calib_samples=8, calib_seq_len=48, calib_data=data)
        windows = token_windows(model_dir, config)
        assert windows == oracle_windows(model_dir, config)
        assert windows == token_windows(source, config)


@pytest.mark.parametrize(("files", "reason"), [
    ({"tokenizer.json": "{not json"}, "its tokenizer.json cannot be read: "),
    ({"tokenizer.json": None, "tokenizer_config.json": "[1, 2]"}, "its tokenizer_config.json holds a list, not "
                                                                   "an object"),
])
def test_an_unusable_tokenizer_is_one_sentence(tmp_path: Path, files: dict[str, str | None], reason: str) -> None:
    model_dir = tmp_path / "bad"
    shutil.copytree(builtin_dir("tiny-llama"), model_dir)
    for name, content in files.items():
        if content is not None:
            (model_dir / name).write_text(content)
    with pytest.raises(KitUsageError) as error:
        token_windows(model_dir, QuantConfig(quant="fp8", calib_samples=4, calib_seq_len=32))
    message = str(error.value)
    assert message.startswith(f"{model_dir} has no usable tokenizer ({reason}")
    assert message.endswith("); calibration tokenizes text with the model's own tokenizer.")
    assert "\n" not in message


def test_calibration_windows_do_not_import_transformers() -> None:
    code = ("import sys; from trtllm_kit.models.builtin import builtin_dir; "
            "from trtllm_kit.quant.algos import QuantConfig; from trtllm_kit.quant.calibrate import token_windows; "
            "windows = token_windows(builtin_dir('tiny-llama'), QuantConfig(quant='fp8', calib_samples=4, "
            "calib_seq_len=32)); print(len(windows), 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["4", "False"]


@pytest.mark.parametrize(("generation", "end_ids"), [
    (None, (2,)),  # no generation_config.json: the tokenizer's eos alone
    ({"eos_token_id": 2}, (2,)),  # SmolLM2-135M-Instruct's: <|im_end|>, its eos and end of turn
    ({"eos_token_id": [0, 2, 7]}, (2, 0, 7)),  # a list (Llama 3 Instruct's kind): each once, the eos first
])
def test_every_end_id_of_the_tokenizer_and_generation_config(tmp_path: Path, generation: dict | None,
                                                             end_ids: tuple[int, ...]) -> None:
    from trtllm_kit.models.text_tokenizer import load_text_tokenizer

    model_dir = tmp_path / "m"
    shutil.copytree(builtin_dir("tiny-llama"), model_dir)
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    if generation is not None:
        (model_dir / "generation_config.json").write_text(json.dumps(generation))
    tokenizer = load_text_tokenizer(model_dir)
    assert tokenizer.eos_id == 2 and tokenizer.end_ids == end_ids


def test_an_end_id_that_is_not_a_token_id_is_refused(tmp_path: Path) -> None:
    from trtllm_kit.models.text_tokenizer import load_text_tokenizer

    model_dir = tmp_path / "m"
    shutil.copytree(builtin_dir("tiny-llama"), model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, "</s>"]}))
    with pytest.raises(ValueError, match=r"^its generation_config.json has eos_token_id \[2, '</s>'\], not token ids$"):
        load_text_tokenizer(model_dir)
