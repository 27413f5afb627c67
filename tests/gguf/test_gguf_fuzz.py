"""Damaged files are refused in one sentence, never with another exception: a small valid GGUF with bytes of its
header overwritten at random (seeded), counts and lengths set to extremes, read through the whole import."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from gguf_files import write_gguf

from trtllm_kit.errors import KitError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.gguf.importer import import_gguf

NUM_CASES = 300
EXTREMES = (0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "m.gguf"
    return write_gguf(builtin_dir("tiny-qwen2"), path, "Q8_0").read_bytes()


def regions(data: bytes) -> list[tuple[int, int]]:
    """Where to damage: the counts and the model's metadata (the first 600 bytes), the tensor table (from its first
    name to past its last), and anywhere in the header (mostly the tokenizer's arrays)."""
    table = data.index(b"token_embd.weight", data.index(b"tokenizer.chat_template")) - 12
    end = data.rindex(b"output_norm.weight") + 64
    return [(4, 600), (table, end), (4, end)]


@pytest.mark.parametrize("seed", range(NUM_CASES))
def test_a_damaged_header_is_refused_in_one_sentence(original: bytes, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = bytearray(original)
    start, end = rng.choice(regions(original))
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(start, end - 8)
        if rng.random() < 0.5:
            data[at:at + 8] = struct.pack("<Q", rng.choice(EXTREMES))
        else:
            data[at] = rng.randrange(256)
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data))
    try:
        import_gguf(path)
    except KitError as exc:
        assert str(exc).count("\n") == 0 and str(exc).endswith((".", ")")), str(exc)
