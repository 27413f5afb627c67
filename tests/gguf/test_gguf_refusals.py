"""What the import refuses, each in one sentence through ``trtllm-kit inspect`` (exit 2): another architecture, a
tensor type gguf cannot dequantize, a truncated file, a FIFO, and header bombs (counts and lengths far past the
file), which are refused after reading a few bytes, with no allocation of what they claim."""

from __future__ import annotations

import os
import struct
import threading
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf_files import write_gguf

from trtllm_kit.cli import cli
from trtllm_kit.errors import ModelError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.gguf.header import HeaderBounds, read_header


def inspect_error(path: Path) -> str:
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    return lines[0].removeprefix("Error: ")


def raw_header(*parts: bytes) -> bytes:
    return b"GGUF" + struct.pack("<I", 3) + b"".join(parts)


def gguf_string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def test_another_architecture_is_refused_by_name(tmp_path: Path) -> None:
    path = write_gguf(builtin_dir("tiny-mistral"), tmp_path / "m.gguf", "F16", arch="gemma")
    assert inspect_error(path) == (f"{path} is a 'gemma' GGUF, which the kit does not import; it imports 'llama', "
                                   "'qwen2' (llama-family) files.")


def test_a_type_gguf_cannot_dequantize_is_refused(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((8, 32), dtype=np.int32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    assert inspect_error(tmp_path / "m.gguf") == (
        f"{tmp_path / 'm.gguf'}: tensor blk.0.ffn_up.weight has type I32, which the installed gguf package cannot "
        "dequantize; convert the model to another type (F16, Q8_0, Q4_K, ...) or update gguf (pip install -U gguf).")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    whole = write_gguf(builtin_dir("tiny-qwen2"), tmp_path / "whole.gguf", "Q4_K").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:-1000])
    assert inspect_error(cut).startswith(f"{cut} is truncated or damaged: tensor output_norm.weight (1024 bytes at ")
    cut.write_bytes(whole[:5000])
    assert inspect_error(cut) == (f"{cut} is truncated: the length of item 430 of tokenizer.ggml.tokens needs 8 "
                                  "bytes at offset 4998, past the file's 5000 bytes; download the file again.")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(inspect_error(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert errors == [f"{fifo} is not a regular file; give the GGUF file itself."]


BOMBS = {
    "metadata entries": (raw_header(struct.pack("<QQ", 0, 1 << 62)),
                         "the metadata entry count is 4611686018427387904, above the bound of 4096"),
    "tensors": (raw_header(struct.pack("<QQ", 1 << 40, 0)), "the tensor count is 1099511627776, above the bound of "
                                                             "65536"),
    "a key's length": (raw_header(struct.pack("<QQQ", 0, 1, 1 << 40)),
                       "the length of the key of metadata entry 0 is 1099511627776, above the bound of 1048576"),
    "an array's items": (raw_header(struct.pack("<QQ", 0, 1), gguf_string("tokenizer.ggml.tokens"),
                                    struct.pack("<IIQ", 9, 8, 1 << 36)),
                         "the item count of tokenizer.ggml.tokens is 68719476736, above the bound of 4194304"),
    "dimensions": (raw_header(struct.pack("<QQ", 1, 0), gguf_string("w"), struct.pack("<I", 1 << 30)),
                   "tensor w has 1073741824 dimensions; the kit reads 1 to 4"),
}


@pytest.mark.parametrize("kind", BOMBS)
def test_a_header_bomb_is_refused_before_allocating(tmp_path: Path, kind: str) -> None:
    raw, message = BOMBS[kind]
    path = tmp_path / "bomb.gguf"
    path.write_bytes(raw + b"\0" * 64)
    tracemalloc.start()
    with pytest.raises(ModelError) as caught:
        read_header(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert message in str(caught.value)
    assert peak < 1 << 20
    assert message in inspect_error(path)


def test_claims_within_the_bounds_but_past_the_file_are_truncation(tmp_path: Path) -> None:
    path = tmp_path / "claims.gguf"  # 4 Mi numbers claimed (32 MB) in a file of under 100 bytes
    path.write_bytes(raw_header(struct.pack("<QQ", 0, 1), gguf_string("tokenizer.ggml.scores"),
                                struct.pack("<IIQ", 9, 10, 1 << 22)) + b"\0" * 16)
    tracemalloc.start()
    with pytest.raises(ModelError, match=r"is truncated: tokenizer\.ggml\.scores needs 33554432 bytes at offset 69"):
        read_header(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20


def test_the_whole_header_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "long.gguf"  # 64 strings of 1 KiB, read under a bound of 16 KiB
    entries = b"".join(gguf_string(f"k{i}") + struct.pack("<I", 8) + gguf_string("x" * 1024) for i in range(64))
    path.write_bytes(raw_header(struct.pack("<QQ", 0, 64), entries))
    with pytest.raises(ModelError, match=r"the header runs past 16384 bytes at k15; no llama-family GGUF"):
        read_header(path, HeaderBounds(max_header_bytes=16384))


def test_a_head_count_of_zero_is_refused(tmp_path: Path) -> None:
    path = write_gguf(builtin_dir("tiny-mistral"), tmp_path / "m.gguf", "F16")
    data = path.read_bytes()
    key = b"llama.attention.head_count"
    at = data.index(key) + len(key) + 4  # past the key and its value type: the uint32 value
    path.write_bytes(data[:at] + struct.pack("<I", 0) + data[at + 4:])
    assert inspect_error(path) == (f"{path}: llama.attention.head_count is 0, not a whole number from 1 to 16777216; "
                                   "the file is damaged: download or convert it again.")
