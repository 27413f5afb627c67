"""The tokenizer description that guided decoding with xgrammar needs: ``xgrammar_tokenizer_info.json``.

The TensorRT-LLM backend reads it through its ``xgrammar_tokenizer_info_path`` parameter (with
``guided_decoding_backend`` ``xgrammar``); the kit's CPU runtime reads the same file. Keys, as TensorRT-LLM's
``generate_xgrammar_tokenizer_info.py`` writes them: ``encoded_vocab`` (every token string, by id),
``tokenizer_str`` (the fast tokenizer's JSON) and ``stop_token_ids`` (the EOS token).
"""

from __future__ import annotations

import json
from pathlib import Path

from trtllm_kit.errors import ModelError

FILE_NAME = "xgrammar_tokenizer_info.json"


def write_xgrammar_tokenizer_info(tokenizer_dir: Path, path: Path) -> Path:
    """Write the tokenizer info of the Hugging Face tokenizer in ``tokenizer_dir`` to ``path``; returns ``path``.

    Arguments:
        tokenizer_dir: a directory with a fast tokenizer (``tokenizer.json``); path: the JSON file to write.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ModelError(f"the tokenizer in {tokenizer_dir} is not a fast tokenizer (no tokenizer.json); guided "
                         "decoding with xgrammar needs one: add tokenizer.json to the model directory.")
    vocab = tokenizer.get_vocab()
    info = {"encoded_vocab": [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
            "tokenizer_str": backend.to_str(),
            "stop_token_ids": [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))
    return path
