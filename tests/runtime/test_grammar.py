"""Structured output on the CPU runtime: 20 sampled generations of a random-weight model under a JSON schema all
parse and validate; regex, choice, EBNF and any-JSON guides hold too; the tokenizer info file the backend reads
gives the same grammar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.errors import KitUsageError
from trtllm_kit.model_repo.xgrammar_info import write_xgrammar_tokenizer_info
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.config import EngineConfig
from trtllm_kit.runtime.executor import Executor
from trtllm_kit.runtime.grammar import GrammarCompiler, Guide
from trtllm_kit.runtime.model import CheckpointModel
from trtllm_kit.runtime.sequence import SamplingParams

pytest.importorskip("xgrammar")
torch.set_num_threads(1)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z ]{1,8}$"},
        "ok": {"type": "boolean"},
        "size": {"enum": ["small", "large"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z]{1,3}$"}, "maxItems": 2},
    },
    "required": ["name", "ok", "size", "tags"],
    "additionalProperties": False,
}
PROMPT = [1, 415, 565, 37]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(builtin_dir("tiny-llama")))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CheckpointModel:
    root = tmp_path_factory.mktemp("ckpt")
    convert_checkpoint(builtin_dir("tiny-llama"), root, tp_size=1, pp_size=1, dtype="float32")
    return CheckpointModel.load(Path(root))


@pytest.fixture(scope="module")
def compiler(model: CheckpointModel, tmp_path_factory: pytest.TempPathFactory) -> GrammarCompiler:
    path = write_xgrammar_tokenizer_info(builtin_dir("tiny-llama"), tmp_path_factory.mktemp("info") / "info.json")
    assert set(json.loads(path.read_text())) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}
    return GrammarCompiler.from_tokenizer_info(path, model.dims.vocab_size)


def generate(model, tokenizer, compiler, guide: Guide, count: int, max_tokens: int = 160,
             all_complete: bool = True) -> list[str]:
    """The outputs of ``count`` seeded samples; those that hit ``max_tokens`` first are dropped unless
    ``all_complete`` requires every grammar to complete."""
    engine = Executor(model, EngineConfig(max_batch_size=count))
    compiled = compiler.compile(guide)
    seqs = [engine.add_request(PROMPT, SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=1.0, seed=i,
                                                      end_id=tokenizer.eos_token_id, guide=compiled))
            for i in range(count)]
    for _ in range(max_tokens + 5):
        if not engine.has_work():
            break
        engine.step()
    if all_complete:
        assert [seq.finish_reason for seq in seqs] == ["end_id"] * count  # every grammar completed
    return [tokenizer.decode(seq.output_ids) for seq in seqs if seq.finish_reason == "end_id"]


def test_twenty_json_schema_generations_validate(model, tokenizer, compiler):
    texts = generate(model, tokenizer, compiler, Guide("json_schema", json.dumps(SCHEMA)), 20)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1


@pytest.mark.parametrize(("guide", "check"), [
    (Guide("regex", r"[a-c]{2}-[0-9]{3}"), lambda t: re.fullmatch(r"[a-c]{2}-[0-9]{3}", t)),
    (Guide("choice", json.dumps(["yes", "no", "maybe \"so\""])), lambda t: t in ("yes", "no", 'maybe "so"')),
    (Guide("ebnf_grammar", 'root ::= "(" [0-9] ("+" [0-9])? ")"'), lambda t: re.fullmatch(r"\(\d(\+\d)?\)", t)),
])
def test_other_guides_hold(model, tokenizer, compiler, guide, check):
    for text in generate(model, tokenizer, compiler, guide, 4, max_tokens=400):
        assert check(text), text


def test_any_json_guide_gives_json_objects(model, tokenizer, compiler):
    """Any JSON object may nest without end: of 6 seeded samples, those that complete are JSON objects."""
    texts = generate(model, tokenizer, compiler, Guide("json"), 6, max_tokens=120, all_complete=False)
    assert texts and all(isinstance(json.loads(text), dict) for text in texts)


@pytest.mark.parametrize(("guide", "message"), [
    (Guide("json_schema", "{not json"), r"^guided_decoding_guide \(json_schema\) cannot be compiled: Failed to parse "
                                        r"JSON: syntax error at line 1 near: not json; fix the guide\.$"),
    (Guide("choice", "[]"), r"^guided_decoding_guide \(choice\) must be a JSON array of strings"),
])
def test_malformed_guides_are_refused(compiler, guide, message):
    with pytest.raises(KitUsageError, match=message):
        compiler.compile(guide)


def test_unknown_guide_type_is_refused():
    with pytest.raises(KitUsageError, match=r"^guided_decoding_guide_type is 'xml'; use one of json, json_schema"):
        Guide("xml", "<a/>")
