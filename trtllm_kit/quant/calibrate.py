"""Calibration (``docs/trtllm-checkpoint.md`` §6): the model runs one decoder layer at a time
(``layer_stream.py``), and every linear of each layer gives the per-channel amax of its input and output over
seeded windows of a text corpus (``calib_data.py``); the weights' per-row and per-column amax come along. The
compute dtype is bfloat16 unless ``--calib-dtype float32`` (as ModelOpt, which calibrates in the model's dtype).
Unless given, the number of windows and their length are sized by the device (``calib_size.py``); the build log
says which and why, and, after the first batch, how long the rest will take.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trtllm_kit.errors import KitUsageError
from trtllm_kit.layout import AWQ_GROUP_SIZE
from trtllm_kit.progress import Reporter
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.awq import ScaleSearch
from trtllm_kit.quant.blocks import col_amax, row_col_amax
from trtllm_kit.quant.calib_data import data_sha256, token_windows
from trtllm_kit.quant.calib_size import BATCH_SIZE, calibration_device, choose_size, sized
from trtllm_kit.quant.layer_stream import LAYER_PREFIX, LayerStream

STATS_FILE = "stats.safetensors"
PARAMS_FILE = "calibration.json"
KINDS = ("x", "y", "w", "wc")  # input per in-channel, output per out-channel, weight per row, weight per column
AWQ_KEY = "awq_scale"  # the searched AWQ scale per in-channel (``quant/awq.py``), beside the amax kinds
Recorder = Callable[[torch.Tensor, torch.Tensor], None]  # (a linear's input, its output) -> None
CALIB_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class CalibrationStats:
    """amax statistics per HF linear module (``model.layers.0.self_attn.q_proj``), all float32 1-D."""

    x: dict[str, torch.Tensor] = field(default_factory=dict)
    y: dict[str, torch.Tensor] = field(default_factory=dict)
    w: dict[str, torch.Tensor] = field(default_factory=dict)
    wc: dict[str, torch.Tensor] = field(default_factory=dict)
    awq: dict[str, torch.Tensor] = field(default_factory=dict)  # INT4 AWQ: the best scale per input channel
    params: dict[str, Any] = field(default_factory=dict)

    def get(self, kind: str, module: str) -> torch.Tensor:
        """One statistic; a missing module is a stats file that does not belong to the model.

        Arguments:
            kind: ``x``, ``y``, ``w``, ``wc`` or ``awq``; module: the HF module name.
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
        rows, cols = row_col_amax(weight.detach())
        self.w[module], self.wc[module] = rows.cpu(), cols.cpu()

    def save(self, directory: Path) -> None:
        """Write ``stats.safetensors`` and ``calibration.json`` into ``directory`` (created if needed).

        Arguments:
            directory: e.g. the artifact's ``calibration/``.
        """
        directory.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors(), str(directory / STATS_FILE))
        (directory / PARAMS_FILE).write_text(json.dumps(self.params, indent=2) + "\n")

    def tensors(self) -> dict[str, torch.Tensor]:
        """The statistics by their names in ``stats.safetensors``: ``<module>.<kind>_amax``, ``<module>.awq_scale``."""
        tensors = {f"{module}.{kind}_amax": t.contiguous()
                   for kind in KINDS for module, t in getattr(self, kind).items()}
        tensors.update({f"{module}.{AWQ_KEY}": t.contiguous() for module, t in self.awq.items()})
        return tensors

    @classmethod
    def load(cls, directory: Path) -> CalibrationStats:
        """Read statistics written by ``save``.

        Arguments:
            directory: the directory holding ``stats.safetensors`` and ``calibration.json``.
        """
        params = json.loads((directory / PARAMS_FILE).read_text())
        return cls.from_tensors(load_file(str(directory / STATS_FILE)), params)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], params: dict[str, Any]) -> CalibrationStats:
        """Statistics from the tensors ``tensors()`` names and their parameters.

        Arguments:
            tensors: ``<module>.<kind>_amax`` and ``<module>.awq_scale`` tensors; params: ``params``.
        """
        stats = cls(params=params)
        for key, tensor in tensors.items():
            module, kind = key.rsplit(".", 1)
            getattr(stats, "awq" if kind == AWQ_KEY else kind.removesuffix("_amax"))[module] = tensor
        return stats


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
    stats = collect_stats(model_path, windows, reporter, device, CALIB_DTYPES[config.calib_dtype],
                          search_awq=config.searches_awq, awq_group_size=config.awq_group_size)
    stats.params = {**calibration_params(config, device), **stats.params, "size_reason": size.reason,
                    "seconds": round(time.perf_counter() - started, 3)}
    return stats


def calibration_params(config: QuantConfig, device: str) -> dict[str, Any]:
    """What decides the statistics of ``calibrate(model, config, device=device)`` besides the model: the
    calibration's parameters as sized for the device, the data file's sha256 and the device.

    Arguments:
        config: the quantization with its calibration settings; device: ``cpu`` or a CUDA device name.
    """
    config = sized(config, choose_size(config, device))
    return {**config.calibration_params(), "data_sha256": data_sha256(config.calib_data), "device": device}


def collect_stats(model_path: Path, windows: list[list[int]], reporter: Reporter | None = None,
                  device: str | None = None, dtype: torch.dtype = torch.bfloat16,
                  search_awq: bool = False, awq_group_size: int = AWQ_GROUP_SIZE) -> CalibrationStats:
    """Stream the model a decoder layer at a time (``layer_stream.py``) over the windows, each linear's input and
    output going to its recorder; the weights' amax comes from the stored tensors (exact in any compute dtype).
    ``lm_head`` is never run. Inference only, no grad. With ``search_awq`` each layer runs twice over the windows,
    as ModelOpt's ``awq_lite`` runs the model twice: the first pass takes each linear's activation profile, the
    second its AWQ losses (``quant/awq.py``); every linear sees the unquantized layer's inputs.

    Arguments:
        model_path: the HF model directory; windows: token-id lists (equal lengths batch together);
        reporter: progress; device: a torch device (default: ``cuda`` when available, else ``cpu``);
        dtype: the compute dtype; search_awq: also search the INT4 AWQ scales; awq_group_size: their group size.
    """
    from trtllm_kit.models.inspect import inspect_model

    reporter = reporter or Reporter()
    device = device or calibration_device()
    stream = LayerStream(inspect_model(str(model_path), allow_pickle=True), dtype, device)
    batches = [windows[i:i + BATCH_SIZE] for i in range(0, len(windows), BATCH_SIZE)]
    stats = CalibrationStats()
    num_tokens = sum(len(w) for w in windows)
    total = num_tokens * stream.num_layers
    with torch.no_grad(), reporter.task("calibrate", total, unit="tokens") as advance:
        hidden = [stream.embed(batch) for batch in batches]
        started = time.perf_counter()
        for index in range(stream.num_layers):
            weights = stream.layer_weights(index)
            layer = stream.build_layer(index, weights)
            prefix = LAYER_PREFIX.format(index)
            for sub in layer.linears:
                stats.add_weight(prefix + sub, weights[f"{sub}.weight"])
            del weights
            recorders = {sub: _recorder(stats, prefix + sub) for sub in layer.linears}
            if search_awq:
                searches = {sub: ScaleSearch(weight, bias, awq_group_size)
                            for sub, (weight, bias) in layer.linears.items()}
                for batch in hidden:
                    layer.forward(batch, partial(_observe, searches))
                recorders = {sub: _both(recorders[sub], partial(_search, searches[sub])) for sub in recorders}
            for number, batch in enumerate(hidden):
                hidden[number] = layer.forward(batch, partial(_dispatch, recorders))
                advance(batch.shape[0] * batch.shape[1])
            if search_awq:
                stats.awq.update({prefix + sub: search.best_scale().cpu() for sub, search in searches.items()})
            del layer
            if index == 0 and stream.num_layers > 1:
                reporter.note(eta_note(num_tokens, total, time.perf_counter() - started))
    stats.params = {"num_windows": len(windows), "num_tokens": num_tokens, "device": device,
                    "dtype": str(dtype).removeprefix("torch.")}
    return stats


def eta_note(done: int, total: int, seconds: float) -> str:
    """One line for the build log after the first layer: the rate and the time the rest will take.

    Arguments:
        done: tokens through layers so far; total: tokens times layers; seconds: time they took.
    """
    rate = done / seconds if seconds > 0 else float("inf")
    left = (total - done) / rate if rate > 0 else 0.0
    when = f"{left / 60:.1f} min" if left >= 90 else f"{left:.0f} s"
    return f"calibrate: {done}/{total} tokens in {seconds:.1f} s ({rate:.0f} tokens/s); about {when} left"


def _dispatch(recorders: dict[str, Recorder], name: str, x: torch.Tensor, y: torch.Tensor) -> None:
    recorders[name](x, y)


def _observe(searches: dict[str, ScaleSearch], name: str, x: torch.Tensor, y: torch.Tensor) -> None:
    for window in x:  # one step per window, whatever the batch
        searches[name].observe(window)


def _search(search: ScaleSearch, x: torch.Tensor, y: torch.Tensor) -> None:
    for window_x, window_y in zip(x, y, strict=True):
        search.search(window_x, window_y)


def _both(first: Recorder, second: Recorder) -> Recorder:
    def both(x: torch.Tensor, y: torch.Tensor) -> None:
        first(x, y)
        second(x, y)
    return both


def _recorder(stats: CalibrationStats, name: str) -> Recorder:
    def record(x: torch.Tensor, y: torch.Tensor) -> None:
        x_amax = col_amax(x.detach().reshape(-1, x.shape[-1])).cpu()
        y_amax = col_amax(y.detach().reshape(-1, y.shape[-1])).cpu()
        stats.x[name] = torch.maximum(stats.x[name], x_amax) if name in stats.x else x_amax
        stats.y[name] = torch.maximum(stats.y[name], y_amax) if name in stats.y else y_amax
    return record
