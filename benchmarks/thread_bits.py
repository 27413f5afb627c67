"""Whether a model's float32 logits are the same bits at one torch thread and at two, on this machine: the forward
pass of the converted checkpoint over a few shapes (rows of one token, as decode steps; rows of several, as
prompts), each at both counts. The served model chooses its count per step (``runtime/threads.py``); this says
whether that choice can move a row's bits here.

    python benchmarks/thread_bits.py [--model smollm2-135m-instruct]

Prints, per shape [sequences, tokens], whether the logits are equal and the largest difference.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from trtllm_kit.checkpoint.convert import convert_checkpoint
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.model import CheckpointModel

SHAPES = ((1, 1), (2, 1), (8, 1), (1, 5), (8, 24))  # [sequences, tokens]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model name")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        convert_checkpoint(builtin_dir(args.model), Path(tmp) / "ckpt", dtype="float32")
        model = CheckpointModel.load(Path(tmp) / "ckpt")  # held in memory: the directory may go
    ids = torch.randint(0, model.dims.vocab_size, (8, 24), generator=torch.Generator().manual_seed(0))
    for sequences, tokens in SHAPES:
        logits = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            logits.append(model.forward(ids[:sequences, :tokens]))
        difference = (logits[0] - logits[1]).abs().max().item()
        verdict = "equal" if torch.equal(*logits) else "differ"
        print(f"{args.model} [{sequences}, {tokens}]: one thread and two {verdict} "
              f"(largest difference {difference:.3g})")


if __name__ == "__main__":
    main()
