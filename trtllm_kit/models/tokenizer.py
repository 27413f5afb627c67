"""The built-in models' tokenizer: a byte-level BPE trained on the shipped corpus, saved as HF files.

The pipeline (NFC, Qwen2's split regex, byte-level) is exactly the one transformers 5 rebuilds for a
``qwen2`` model whatever ``tokenizer_class`` says, so all three models tokenize alike on transformers 4 and 5.
Training with ``tokenizers`` on a fixed corpus is deterministic (merge ties are broken by the pair, not by
hash order); ``tests/models/test_builtin.py`` checks that two generations are byte-identical.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<pad>", "<s>", "</s>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)  # ids 0, 1, 2, ... in this order
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TOKENIZER_VOCAB_SIZE = 1024
SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# One turn is "<|role|>\n{content}</s>"; the prompt for a reply ends with "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant, not ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def corpus_path() -> Path:
    """The shipped English corpus (one paragraph per line) used for the tokenizer and for calibration."""
    return Path(str(resources.files("trtllm_kit") / "data" / "corpus.txt"))


def train_tokenizer(lines: list[str], vocab_size: int = TOKENIZER_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE tokenizer that adds ``<s>`` in front of every encoded text.

    Arguments:
        lines: the training text, one paragraph per item.
        vocab_size: the tokenizer's size including the special tokens.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    # The same template that transformers 5 rebuilds from ``add_bos_token``, so both versions agree.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0", pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(len(SPECIAL_TOKENS))), f"special tokens got ids {ids}"
    assert tokenizer.get_vocab_size() == vocab_size, tokenizer.get_vocab_size()
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict[str, Any]:
    """The ``tokenizer_config.json`` content, readable by transformers 4.57 and 5.x alike.

    Arguments:
        model_max_length: the longest sequence the model accepts.
    """
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(model_dir: Path, model_max_length: int) -> None:
    """Train the tokenizer on the shipped corpus and write its HF files into ``model_dir``.

    Arguments:
        model_dir: the model directory being generated.
        model_max_length: the longest sequence the model accepts.
    """
    lines = corpus_path().read_text(encoding="utf-8").splitlines()
    tokenizer = train_tokenizer([line for line in lines if line.strip()])
    tokenizer.save(str(model_dir / "tokenizer.json"), pretty=True)
    files = {
        "tokenizer_config.json": tokenizer_config(model_max_length),
        "special_tokens_map.json": {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN},
    }
    for name, content in files.items():
        (model_dir / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
