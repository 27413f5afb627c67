"""The ``[speculative]`` table: its flags and keys, what the manifest records, and the refusals that need the table
alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_kit.errors import KitUsageError
from trtllm_kit.spec import BuildSpec
from trtllm_kit.spec.config_file import load_toml
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions, lookahead_draft_len


def test_the_table_is_recorded_in_the_spec_dict(tmp_path: Path) -> None:
    spec = BuildSpec.from_dict({"model": "builtin:tiny-llama", "out": str(tmp_path / "out"),
                                "speculative": {"mode": "draft-target", "draft_model": str(tmp_path / "draft"),
                                                "max_draft_len": 5}})
    assert spec.speculative.mode is Speculation.DRAFT_TARGET
    assert spec.speculative.draft_model == tmp_path / "draft"
    recorded = spec.to_dict()["speculative"]
    assert recorded["mode"] == "draft-target" and recorded["draft_model"] == str(tmp_path / "draft")
    assert recorded["max_draft_len"] == 5
    assert BuildSpec.from_dict(spec.to_dict()) == spec


def test_a_spec_without_the_table_has_no_speculation(tmp_path: Path) -> None:
    spec = BuildSpec.from_dict({"model": "builtin:tiny-llama", "out": str(tmp_path)})
    assert spec.speculative.mode is None and spec.speculative.draft_len == 0


def test_the_toml_keys_are_read(tmp_path: Path) -> None:
    path = tmp_path / "trtllm-kit.toml"
    path.write_text('model = "builtin:tiny-llama"\n[speculative]\nmode = "lookahead"\nlookahead_window_size = 5\n')
    values = load_toml(path)
    spec = BuildSpec.from_dict({**values, "out": str(tmp_path / "out")})
    assert spec.speculative.mode is Speculation.LOOKAHEAD
    assert spec.speculative.draft_len == lookahead_draft_len(5, 3, 4) == 1 + 8 * 2


@pytest.mark.parametrize(("mode", "draft_len"), [("ngram", 4), ("draft-target", 4), ("eagle3", 3),
                                                 ("lookahead", 1 + 7 * 2)])
def test_default_draft_lengths(mode: str, draft_len: int, tmp_path: Path) -> None:
    draft = tmp_path if mode in ("draft-target", "eagle3") else None
    assert SpeculativeOptions(mode=Speculation(mode), draft_model=draft).draft_len == draft_len


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "ngram", "draft_model": "d"}, "--speculative ngram takes no --draft-model, got d; drop it or use "
                                            "--speculative draft-target."),
    ({"draft_model": "d"}, "--draft-model is given without --speculative; add --speculative draft-target (or another "
                           "mode) or drop it."),
    ({"mode": "lookahead", "max_draft_len": 3}, "--max-draft-len 3 does not apply to lookahead"),
    ({"mode": "ngram", "max_draft_len": 0}, "max_draft_len must be a positive integer, got 0."),
    ({"mode": "redrafter"}, "mode"),
])
def test_refusals(values: dict[str, object], message: str) -> None:
    with pytest.raises(KitUsageError) as error:
        SpeculativeOptions(**values)  # type: ignore[arg-type]
    assert str(error.value).startswith(message)
