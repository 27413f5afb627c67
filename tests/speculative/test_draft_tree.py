"""``--draft-choices``: the tree of draft tokens a Medusa or EAGLE engine verifies, as upstream's examples write it
(``[[0], [0, 0], [1]]``), in the ``tensorrt_llm`` model's ``medusa_choices``/``eagle_choices`` spelling (the backend's
``docs/model_config.md``: ``"{0, 0, 0}, {0, 1}"``), setting ``--max_draft_len`` (its paths) and EAGLE's
``num_eagle_layers`` (its depth); refused in one sentence where it is not a tree or the heads cannot draft it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from trtllm_kit.cli import run
from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.models.hf_config import read_hf_config
from trtllm_kit.spec.draft_tree import max_non_leaves, parse_choices
from trtllm_kit.spec.eagle_heads import read_eagle_heads
from trtllm_kit.spec.speculative import Speculation, SpeculativeOptions
from trtllm_kit.spec.speculative_support import decoding_parameters

TREE = "[[0], [0, 0], [1], [0, 1], [0, 0, 0]]"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"draft_tree_{name}", Path(__file__).parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MEDUSA, EAGLE = _module("test_medusa_engine"), _module("test_eagle_engine")


@pytest.mark.parametrize(("mode", "tree"), [("medusa", "medusa_choices"), ("eagle", "eagle_choices")])
def test_the_tree_is_given_in_the_backends_spelling(mode: str, tree: str, tmp_path: Path) -> None:
    options = SpeculativeOptions(mode=Speculation(mode), draft_model=tmp_path, draft_choices=TREE)
    assert options.draft_len == 5
    assert decoding_parameters(options) == {"decoding_mode": mode, tree: "{0}, {0, 0}, {1}, {0, 1}, {0, 0, 0}"}


def test_the_default_tree_is_the_top1_path(tmp_path: Path) -> None:
    options = SpeculativeOptions(mode=Speculation.EAGLE, draft_model=tmp_path, max_draft_len=3)
    assert options.tree == ((0,), (0, 0), (0, 0, 0))


@pytest.mark.parametrize("mode", ["medusa", "eagle"])
def test_the_engine_is_built_for_the_trees_paths(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heads = (MEDUSA if mode == "medusa" else EAGLE).make_heads(tmp_path / "heads")
    assert run(["build", "builtin:tiny-llama", "--out", str(tmp_path / "out"), "--target", "engine", "--gpu",
                "H100-80GB", "--dry-run", "--json", "--speculative", mode, "--draft-model", str(heads),
                "--draft-choices", TREE]) == 0
    argv = json.loads(capsys.readouterr().out)["commands"][0]
    assert argv[argv.index("--max_draft_len") + 1] == "5"


def test_eagle_runs_one_eaglenet_per_depth(tmp_path: Path) -> None:
    base = read_hf_config(builtin_dir("tiny-llama"))
    heads = read_eagle_heads(EAGLE.make_heads(tmp_path / "heads"), base, parse_choices(TREE))
    assert heads.num_eagle_layers == 3
    config = json.loads((builtin_dir("tiny-llama") / "config.json").read_text())
    base_config = {"dtype": "bfloat16", "logits_dtype": "float32", "vocab_size": 1031,
                   "position_embedding_type": "rope_gpt_neox", "hidden_act": "silu",
                   "rotary_base": config["rope_theta"], "rotary_scaling": None, "quantization": {}, "mapping": {},
                   "use_parallel_embedding": False, "embedding_sharding_dim": 0}
    keys = heads.config_keys(base_config, 5)
    assert (keys["num_eagle_layers"], keys["max_draft_len"]) == (3, 5)


@pytest.mark.parametrize(("values", "message"), [
    ({"draft_choices": "[[0], [1]"}, "--draft-choices '[[0], [1]' is not a list of paths of top-k indices; pass "
                                     "e.g. '[[0], [0, 0], [1]]'."),
    ({"draft_choices": "[[0], [-1]]"}, "--draft-choices '[[0], [-1]]' is not a list of paths of top-k indices; "
                                       "pass e.g. '[[0], [0, 0], [1]]'."),
    ({"draft_choices": "[[0], [0]]"}, "--draft-choices names the path [0] twice; name each path once."),
    ({"draft_choices": "[[0], [1, 0]]"}, "--draft-choices has the path [1, 0] without its parent [1]; add the "
                                         "parent."),
    ({"draft_choices": "[[0], [1]]", "max_draft_len": 3},
     "--max-draft-len 3 differs from the 2 paths of --draft-choices, which set the draft length; drop "
     "--max-draft-len."),
    ({"mode": "draft-target", "draft_choices": "[[0]]"},
     "--draft-choices applies to --speculative medusa or eagle, got draft-target; drop it."),
    ({"mode": None, "draft_model": None, "draft_choices": "[[0]]"},
     "--draft-choices is given without --speculative; add --speculative draft-target (or another mode) or drop it."),
])
def test_a_choices_list_that_is_not_a_tree_is_refused(values: dict[str, object], message: str,
                                                      tmp_path: Path) -> None:
    with pytest.raises(KitUsageError) as refused:
        SpeculativeOptions(**({"mode": Speculation.MEDUSA, "draft_model": tmp_path} | values))  # type: ignore[arg-type]
    assert str(refused.value) == message


def test_trees_the_heads_cannot_draft_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    medusa = MEDUSA.make_heads(tmp_path / "medusa")  # 3 heads
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "out"), "--target", "engine", "--gpu",
                "H100-80GB", "--speculative", "medusa", "--draft-model", str(medusa), "--draft-choices",
                "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]"]) != 0
    assert (f"Error: --draft-choices reaches depth 4, beyond the 3 heads of --draft-model {medusa}; pass paths of 3 "
            "indices or fewer.") in capsys.readouterr().err
    wide = json.dumps([[i] for i in range(12)] + [[i, 0] for i in range(11)])
    assert max_non_leaves(parse_choices(wide)) == 11
    eagle = EAGLE.make_heads(tmp_path / "eagle")
    assert run(["plan", "builtin:tiny-llama", "--out", str(tmp_path / "out"), "--target", "engine", "--gpu",
                "H100-80GB", "--speculative", "eagle", "--draft-model", str(eagle), "--draft-choices", wide]) != 0
    assert ("Error: --draft-choices has 11 nodes with children at one depth, more than the engine's "
            "max_non_leaves_per_layer 10; pass a narrower tree.") in capsys.readouterr().err
