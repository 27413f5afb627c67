"""Calibration (``docs/trtllm-checkpoint.md`` §6): forward hooks on the ``transformers`` model record per-channel
amax of every linear layer's input and output over seeded samples of a text corpus; the weights' per-row and
per-column amax come along.

The text is the corpus shipped with the package (``trtllm_kit/data/corpus.txt``) or ``--calib-data FILE``
(``.txt``: one text per non-empty line; ``.jsonl``: one object with a ``"text"`` string per line). All texts are
tokenized into one stream, and ``samples`` windows of ``seq_len`` tokens (``<bos>`` first when the tokenizer has
one) start at offsets drawn from a ``torch.Generator`` seeded with ``seed``. Unless given, ``samples`` and
``seq_len`` are sized by the device (``calib_size.py``); the build log says which and why, and, after the first
batch, how long the rest will take.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.errors import KitUsageError
from trtllm_kit.models.hf_model import load_causal_lm
from trtllm_kit.models.tokenizer import corpus_path
from trtllm_kit.progress import Reporter
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.blocks import col_amax, row_amax
from trtllm_kit.quant.calib_size import calibration_device, choose_size, sized

STATS_FILE = "stats.safetensors"
PARAMS_FILE = "calibration.json"
KINDS = ("x", "y", "w", "wc")  # input per in-channel, output per out-channel, weight per row, weight per column
BATCH_SIZE = 8  # windows per forward pass on a GPU; one on a CPU, where batching gains little and the ETA
# would move only every 8 windows


@dataclass
class CalibrationStats:
    """amax statistics per HF linear module (``model.layers.0.self_attn.q_proj``), all float32 1-D."""

    x: dict[str, torch.Tensor] = field(default_factory=dict)
    y: dict[str, torch.Tensor] = field(default_factory=dict)
    w: dict[str, torch.Tensor] = field(default_factory=dict)
    wc: dict[str, torch.Tensor] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    def get(self, kind: str, module: str) -> torch.Tensor:
        """One statistic; a missing module is a stats file that does not belong to the model.

        Arguments:
            kind: ``x``, ``y``, ``w`` or ``wc``; module: the HF module name.
        """
        table = getattr(self, kind)
        if module not in table:
            raise KitUsageError(f"the calibration statistics have no {kind!r} entry for {module}; they were "
                                "collected on another model: calibrate again.")
        return table[module]

    def add_weight(self, module: str, weight: torch.Tensor) -> None:
        """Record a weight's per-row and per-column amax.

        Arguments:
            module: the HF module name; weight: its [out, in] weight.
        """
        self.w[module] = row_amax(weight.detach()).cpu()
        self.wc[module] = col_amax(weight.detach()).cpu()

    def save(self, directory: Path) -> None:
        """Write ``stats.safetensors`` and ``calibration.json`` into ``directory`` (created if needed).

        Arguments:
            directory: e.g. the artifact's ``calibration/``.
        """
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"{module}.{kind}_amax": t.contiguous()
                   for kind in KINDS for module, t in getattr(self, kind).items()}
        save_file(tensors, str(directory / STATS_FILE))
        (directory / PARAMS_FILE).write_text(json.dumps(self.params, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> CalibrationStats:
        """Read statistics written by ``save``.

        Arguments:
            directory: the directory holding ``stats.safetensors`` and ``calibration.json``.
        """
        stats = cls(params=json.loads((directory / PARAMS_FILE).read_text()))
        for key, tensor in load_file(str(directory / STATS_FILE)).items():
            module, kind = key.rsplit(".", 1)
            getattr(stats, kind.removesuffix("_amax"))[module] = tensor
        return stats


def read_texts(path: Path | None) -> list[str]:
    """The calibration texts: the shipped corpus, or a ``.txt`` / ``.jsonl`` file.

    Arguments:
        path: the user's file, or None for the shipped corpus.
    """
    source = path or corpus_path()
    if path is not None and path.suffix not in (".txt", ".jsonl"):
        raise KitUsageError(f"--calib-data {path} has the suffix {path.suffix!r}; pass a .txt file (one text per "
                            "line) or a .jsonl file with a \"text\" field per line.")
    try:
        raw = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KitUsageError(f"--calib-data {source} cannot be read ({reason}); pass a readable UTF-8 .txt or "
                            ".jsonl file.") from None
    if source.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KitUsageError(f"--calib-data {source}: line {number} is not JSON ({exc.msg}); each line "
                                    "must be an object with a \"text\" string.") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise KitUsageError(f"--calib-data {source}: line {number} has no \"text\" string; each line must "
                                    "be an object with a \"text\" string.")
            texts.append(record["text"])
    else:
        texts = raw.splitlines()
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise KitUsageError(f"--calib-data {source} holds no text; calibration needs at least one non-empty "
                            "line.")
    return texts


def sample_windows(stream: list[int], samples: int, seq_len: int, seed: int,
                   bos_id: int | None) -> list[list[int]]:
    """``samples`` windows of ``seq_len`` tokens at seeded offsets of the token stream (one when it is short).

    Arguments:
        stream: the tokenized texts; samples: windows wanted; seq_len: tokens per window (``<bos>`` included);
        seed: the generator seed; bos_id: prepended to each window when not None.
    """
    body = seq_len - 1 if bos_id is not None else seq_len
    head = [bos_id] if bos_id is not None else []
    if len(stream) <= body:
        return [head + stream]
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - body + 1, (samples,), generator=generator).tolist()
    return [head + stream[s:s + body] for s in starts]


def token_windows(model_path: Path, config: QuantConfig) -> list[list[int]]:
    """Tokenize the calibration texts with the model's tokenizer and draw the windows.

    Arguments:
        model_path: the HF model directory (its tokenizer is used); config: samples, seq_len, seed, data.
    """
    from transformers import AutoTokenizer

    texts = read_texts(config.calib_data)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    except (OSError, ValueError) as exc:
        raise KitUsageError(f"{model_path} has no usable tokenizer ({exc}); calibration tokenizes text with the "
                            "model's own tokenizer.") from None
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            stream.append(tokenizer.eos_token_id)
    if not stream:
        raise KitUsageError("the calibration texts tokenize to nothing; pass text with content in --calib-data.")
    assert config.calib_samples is not None and config.calib_seq_len is not None, "size it first (sized)"
    return sample_windows(stream, config.calib_samples, config.calib_seq_len, config.calib_seed,
                          tokenizer.bos_token_id)


def calibrate(model_path: Path, config: QuantConfig, reporter: Reporter | None = None,
              device: str | None = None) -> CalibrationStats:
    """Run the HF model over the calibration windows of ``config`` and collect amax statistics.

    Arguments:
        model_path: the HF model directory; config: the quantization with its calibration settings;
        reporter: progress; device: a torch device (default: ``cuda`` when available, else ``cpu``).
    """
    started = time.perf_counter()
    reporter = reporter or Reporter()
    device = device or calibration_device()
    size = choose_size(config, device)
    config = sized(config, size)
    reporter.note(f"calibrate: {size.samples} windows x {size.seq_len} tokens on {device}: {size.reason}")
    windows = token_windows(model_path, config)
    stats = collect_stats(model_path, windows, reporter, device)
    source = config.calib_data or corpus_path()
    stats.params = {**config.calibration_params(), **stats.params, "size_reason": size.reason,
                    "data_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
                    "seconds": round(time.perf_counter() - started, 3)}
    return stats


def collect_stats(model_path: Path, windows: list[list[int]], reporter: Reporter | None = None,
                  device: str | None = None) -> CalibrationStats:
    """Forward hooks on every linear layer (``lm_head`` excluded) of the HF model, float32, eval, no grad.

    Arguments:
        model_path: the HF model directory; windows: token-id lists (equal lengths batch together);
        reporter: progress; device: a torch device (default: ``cuda`` when available, else ``cpu``).
    """
    device = device or calibration_device()
    model = load_causal_lm(model_path, torch.float32).to(device)
    return collect_model_stats(model, windows, reporter, device)


def collect_model_stats(model: torch.nn.Module, windows: list[list[int]], reporter: Reporter | None = None,
                        device: str = "cpu") -> CalibrationStats:
    """``collect_stats`` on a model already loaded on ``device`` (float32, eval).

    Arguments:
        model: the causal LM; windows: token-id lists; reporter: progress; device: where the model is.
    """
    reporter = reporter or Reporter()
    stats = CalibrationStats()
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            stats.add_weight(name, module.weight)
            handles.append(module.register_forward_hook(_recorder(stats, name)))
    per_batch = 1 if device == "cpu" else BATCH_SIZE
    batches = [windows[i:i + per_batch] for i in range(0, len(windows), per_batch)]
    total = sum(len(w) for w in windows)
    try:
        with torch.no_grad(), reporter.task("calibrate", total, unit="tokens") as advance:
            started, done = time.perf_counter(), 0
            for number, batch in enumerate(batches):
                model(torch.tensor(batch, dtype=torch.int64, device=device))
                advance(sum(len(w) for w in batch))
                done += sum(len(w) for w in batch)
                if number == 0 and len(batches) > 1:
                    reporter.note(eta_note(done, total, time.perf_counter() - started))
    finally:
        for handle in handles:
            handle.remove()
    stats.params = {"num_windows": len(windows), "num_tokens": sum(len(w) for w in windows), "device": device}
    return stats


def eta_note(done: int, total: int, seconds: float) -> str:
    """One line for the build log after the first batch: the rate and the time the rest will take.

    Arguments:
        done: tokens calibrated so far; total: tokens in all; seconds: time they took.
    """
    rate = done / seconds if seconds > 0 else float("inf")
    left = (total - done) / rate if rate > 0 else 0.0
    when = f"{left / 60:.1f} min" if left >= 90 else f"{left:.0f} s"
    return f"calibrate: {done}/{total} tokens in {seconds:.1f} s ({rate:.0f} tokens/s); about {when} left"


def _recorder(stats: CalibrationStats, name: str) -> Callable[..., None]:
    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        x = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0).float().cpu()
        y = output.detach().abs().reshape(-1, output.shape[-1]).amax(0).float().cpu()
        stats.x[name] = torch.maximum(stats.x[name], x) if name in stats.x else x
        stats.y[name] = torch.maximum(stats.y[name], y) if name in stats.y else y
    return hook
