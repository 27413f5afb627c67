"""The serving tokenizer read without transformers (``models/hf_tokenizer.py``, ``models/chat_template.py``) against
transformers as the oracle: the same ids, text, vocabulary size, special tokens and chat prompts for the built-in
tokenizer and for directories written to reach each rule (a template file before the config's, named templates,
``raise_exception``, ``tojson``, loop controls, the ``generation`` block, the clean-up of spaces), the sandbox
holds, and a directory without ``tokenizer.json`` is transformers' behind the same methods."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from trtllm_kit.models.chat_template import ChatTemplateError
from trtllm_kit.models.hf_tokenizer import HFTokenizer
from trtllm_kit.models.tokenizer import write_tokenizer

TEXTS = ["The cat sat on the mat.", "  two spaces,\ttabs\nand\r\nnewlines  ", "It's 12:30; x = 42 * 3.0!",
         "Café à 3 °C — naïve façade, 日本語, emoji 🚀.", "", "<s>a</s> <|user|>"]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 🚀"}, {"role": "user", "content": ""}],
]
# every rule a Hub template leans on, in one template
RULES_TEMPLATE = (
    "{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}"
    "  {{ m.role | upper }}: {{ m.content | tojson }}\n"
    "{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endif %}"
    "{% if m.content == 'stop' %}{% break %}{% endif %}"
    "{% endfor %}"
    "{{ ns.n }}{{ tools is none }}{{ documents is none }}{{ eos_token }}"
    "{% if add_generation_prompt %}<go>{% endif %}"
)


def hf_oracle(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


@pytest.fixture(scope="module")
def builtin_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory: Path = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(directory, 2048)
    return directory


def _with_config(source: Path, target: Path, **changes: Any) -> Path:
    shutil.copytree(source, target)
    path = target / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return target


def test_the_builtin_tokenizer_reads_as_transformers_reads_it(builtin_tokenizer: Path) -> None:
    ours, theirs = HFTokenizer(builtin_tokenizer), hf_oracle(builtin_tokenizer)
    assert ours.vocab_size == len(theirs)
    assert ours.special_tokens == theirs.special_tokens_map
    assert ours.token_id("eos_token") == theirs.eos_token_id and ours.token_id("bos_token") == theirs.bos_token_id
    assert ours.token_id("unk_token") is None
    for text in TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs(text, add_special_tokens=special).input_ids, text
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    rng = random.Random(5)
    for _ in range(100):  # ids a small random model emits: split characters, special tokens anywhere
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 30))]
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids
    for chat in CHATS:
        assert ours.render_chat(chat) == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_every_rule_of_a_template_renders_as_transformers_renders_it(builtin_tokenizer: Path, tmp_path: Path) -> None:
    directory = _with_config(builtin_tokenizer, tmp_path / "rules", chat_template=RULES_TEMPLATE)
    chat = [{"role": "user", "content": 'say "hi" <b>'}, {"role": "skip", "content": "x"},
            {"role": "assistant", "content": "ünïcode"}, {"role": "user", "content": "stop"},
            {"role": "user", "content": "never rendered"}]
    ours = HFTokenizer(directory).render_chat(chat)
    assert ours == hf_oracle(directory).apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert '"say \\"hi\\" <b>"' in ours and "[ünïcode]" in ours and "never" not in ours and ours.endswith("<go>")


def test_a_template_file_comes_before_the_config_and_named_templates_use_default(builtin_tokenizer: Path,
                                                                                 tmp_path: Path) -> None:
    named = _with_config(builtin_tokenizer, tmp_path / "named", chat_template=[
        {"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT {{ messages | length }}"}])
    assert HFTokenizer(named).render_chat(CHATS[1]) == "DEFAULT 2" == hf_oracle(named).apply_chat_template(
        CHATS[1], tokenize=False, add_generation_prompt=True)
    filed = _with_config(builtin_tokenizer, tmp_path / "filed")
    (filed / "chat_template.jinja").write_text("FILE {{ bos_token }}")
    assert HFTokenizer(filed).render_chat(CHATS[0]) == "FILE <s>" == hf_oracle(filed).apply_chat_template(
        CHATS[0], tokenize=False, add_generation_prompt=True)
    bare = _with_config(builtin_tokenizer, tmp_path / "bare", chat_template=None)
    assert HFTokenizer(bare).chat_template is None
    with pytest.raises(ValueError, match="has no chat template"):
        HFTokenizer(bare).render_chat(CHATS[0])


def test_a_refusal_and_a_sandbox_escape_are_chat_template_errors(builtin_tokenizer: Path, tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="roles are system, user and assistant, not tool"):
        HFTokenizer(builtin_tokenizer).render_chat([{"role": "tool", "content": "x"}])
    escape = _with_config(builtin_tokenizer, tmp_path / "escape",
                          chat_template="{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        HFTokenizer(escape).render_chat(CHATS[0])
    mutate = _with_config(builtin_tokenizer, tmp_path / "mutate",
                          chat_template="{{ messages.append({'role': 'x'}) }}{{ messages | length }}")
    with pytest.raises(ChatTemplateError):
        HFTokenizer(mutate).render_chat(CHATS[0])
    broken = _with_config(builtin_tokenizer, tmp_path / "broken", chat_template="{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="does not parse"):
        HFTokenizer(broken).render_chat(CHATS[0])


def _word_level_tokenizer(directory: Path, clean_up: bool) -> Path:
    """A WordLevel tokenizer (whitespace-split words): the kind transformers' clean-up of spaces is meant for."""
    directory.mkdir()
    words = ["[UNK]", "[SEP]", "it", "'s", "n't", "do", ".", ",", "?", "!", "yes", "'m", "i", "we", "'re", "'ve"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["[SEP]"])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "sep_token": "[SEP]",
              "clean_up_tokenization_spaces": clean_up}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("clean_up", [True, False])
def test_spaces_are_cleaned_up_as_the_config_says_and_never_for_bpe(builtin_tokenizer: Path, tmp_path: Path,
                                                                    clean_up: bool) -> None:
    directory = _word_level_tokenizer(tmp_path / "words", clean_up)
    ours, theirs = HFTokenizer(directory), hf_oracle(directory)
    text = "it 's yes . do n't , i 'm ? we 're ! we 've [SEP]"
    ids = ours.encode(text)
    assert ids == theirs(text).input_ids
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert (ours.decode(ids) == "it's yes. don't, i'm? we're! we've") is clean_up
    bpe = _with_config(builtin_tokenizer, tmp_path / "bpe", clean_up_tokenization_spaces=True)
    ids = HFTokenizer(bpe).encode("a , b .")
    assert HFTokenizer(bpe).decode(ids) == hf_oracle(bpe).decode(ids, skip_special_tokens=True)


def test_a_directory_without_tokenizer_json_is_read_by_transformers_behind_the_same_methods(
        builtin_tokenizer: Path, tmp_path: Path) -> None:
    """Slow-tokenizer files alone (a BPE's ``vocab.json`` and ``merges.txt``): transformers reads them."""
    directory = tmp_path / "slow"
    directory.mkdir()
    Tokenizer.from_file(str(builtin_tokenizer / "tokenizer.json")).model.save(str(directory))
    config = json.loads((builtin_tokenizer / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    shutil.copy(builtin_tokenizer / "special_tokens_map.json", directory)
    ours, theirs = HFTokenizer(directory), hf_oracle(directory)
    assert ours.vocab_size == len(theirs) and ours.special_tokens == theirs.special_tokens_map
    assert ours.token_id("eos_token") == theirs.eos_token_id is not None
    ids = ours.encode(TEXTS[0])
    assert ids == theirs(TEXTS[0]).input_ids and ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.render_chat(CHATS[1]) == theirs.apply_chat_template(CHATS[1], tokenize=False,
                                                                    add_generation_prompt=True)
