"""One decode step's matrix products on a built-in model's shapes, in the weight layout the runtime held before
(``[out, in]`` contiguous), in its product layout (``runtime/layers.product_layout``) and packed for oneDNN
(``runtime/products.py``, which the runtime multiplies at two rows or more), at 1 and 8 rows; beside them, how long
one core takes to read the step's weights once.

    python benchmarks/linear_layouts.py [--model smollm2-135m-instruct] [--rows 1,2,8,32,64] [--rounds 5]

Every layer gets its own random tensors, so the weights are cold in memory as the model's are (a step reads them all
once); each figure is the median CPU time (``time.thread_time``) of ``--rounds`` passes over every product, after
one untimed pass, at one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.runtime.layers import product_layout
from trtllm_kit.runtime.products import pack, product


def step_shapes(config: dict) -> list[tuple[int, int]]:
    """The [out, in] shape of each product of one decode step: per layer the fused q/k/v, the attention output, the
    fused gate/up and the down projection; then ``lm_head``."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head
    layer = [(qkv, hidden), (hidden, config["num_attention_heads"] * head), (2 * inter, hidden), (hidden, inter)]
    return layer * config["num_hidden_layers"] + [(config["vocab_size"], hidden)]


def products(weights: list[torch.Tensor], inputs: dict[int, torch.Tensor],
             packed: list[torch.Tensor] | None = None) -> None:
    """``x @ W.T`` of every weight, ``x`` the input of its width (with the packed copies when given)."""
    for weight, copy in zip(weights, packed or [None] * len(weights), strict=True):
        product(inputs[weight.shape[1]], weight, copy)


def cpu_ms(run: Callable[[], object], rounds: int) -> float:
    """The median CPU milliseconds of ``rounds`` calls of ``run``, after one untimed."""
    run()
    times = []
    for _ in range(rounds):
        started = time.thread_time()
        run()
        times.append((time.thread_time() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model's name (its shapes)")
    parser.add_argument("--rows", default="1,8", help="comma-separated row counts (sequences in the step)")
    parser.add_argument("--rounds", type=int, default=5, help="timed passes per figure (the median is printed)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = json.loads((builtin_dir(args.model) / "config.json").read_text())
    shapes = step_shapes(config)
    stored = [torch.randn(shape) for shape in shapes]
    laid_out = [product_layout(w) for w in stored]
    packed = [pack(w) for w in stored]
    nbytes = sum(w.numel() * w.element_size() for w in stored)
    flat = torch.cat([w.reshape(-1) for w in stored])
    figures: dict[str, float] = {"weights_gb": nbytes / 1e9, "read_ms": cpu_ms(flat.sum, args.rounds)}
    del flat
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {width: torch.randn(rows, width) for width in {shape[1] for shape in shapes}}
        for layout, weights, copies in (("out_in", stored, None), ("product", laid_out, None),
                                        ("packed", laid_out, packed)):
            figures[f"{layout}_{rows}_ms"] = cpu_ms(lambda w=weights, x=inputs, c=copies: products(w, x, c),
                                                    args.rounds)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    load = os.getloadavg()[0]
    print(f"{args.model}: {len(shapes)} products, {figures['weights_gb']:.2f} GB of float32 weights; one core reads "
          f"them in {figures['read_ms']:.1f} ms ({figures['weights_gb'] / figures['read_ms'] * 1000:.1f} GB/s) | "
          f"load {load:.1f}")
    for rows in (int(r) for r in args.rows.split(",")):
        before, after, packs = (figures[f"{layout}_{rows}_ms"] for layout in ("out_in", "product", "packed"))
        print(f"  {rows:3d} rows: [out, in] {before:7.1f} ms | product layout {after:7.1f} ms ({before / after:.2f}x) "
              f"| packed {packs:7.1f} ms ({before / packs:.2f}x) CPU per step, 1 thread")


if __name__ == "__main__":
    main()
