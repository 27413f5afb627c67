"""The calibration size: by device unless given, said in plan and the build log, with an ETA while it runs."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from trtllm_kit.cli import run
from trtllm_kit.models.builtin import builtin_dir
from trtllm_kit.progress import Reporter, RichReporter
from trtllm_kit.quant.algos import QuantConfig
from trtllm_kit.quant.calib_size import CPU_SAMPLES, CPU_SEQ_LEN, GPU_SAMPLES, GPU_SEQ_LEN, choose_size
from trtllm_kit.quant.calibrate import calibrate, eta_note


class Recorder(Reporter):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


def test_the_default_differs_by_device() -> None:
    cpu, gpu = choose_size(QuantConfig(quant="fp8"), "cpu"), choose_size(QuantConfig(quant="fp8"), "cuda")
    assert (gpu.samples, gpu.seq_len) == (GPU_SAMPLES, GPU_SEQ_LEN) == (512, 512)
    assert (cpu.samples, cpu.seq_len) == (CPU_SAMPLES, CPU_SEQ_LEN)
    assert cpu.tokens * 16 <= gpu.tokens
    assert re.fullmatch(r"the CPU default; about \d+ min for a 7B model on a 2-core CPU, where the GPU default "
                        r"512 x 512 would take \d+ h; --calib-samples/--calib-seq-len set it", cpu.reason)
    assert gpu.reason == "the GPU default (upstream's calibration size)"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_explicit_values_win_on_either_device(device: str) -> None:
    both = choose_size(QuantConfig(quant="fp8", calib_samples=3, calib_seq_len=1000), device)
    assert (both.samples, both.seq_len, both.reason) == (3, 1000, "as given")
    one = choose_size(QuantConfig(kv_cache="int8", calib_samples=3), device)
    assert (one.samples, one.seq_len) == (3, CPU_SEQ_LEN if device == "cpu" else GPU_SEQ_LEN)
    assert one.reason.startswith(f"--calib-seq-len {one.seq_len} is the {'CPU' if device == 'cpu' else 'GPU'} "
                                 "default")


def test_calibration_notes_its_size_and_an_eta_and_records_them() -> None:
    recorder = Recorder()
    stats = calibrate(builtin_dir("tiny-llama"), QuantConfig(quant="fp8", calib_samples=3, calib_seq_len=16),
                      recorder, device="cpu")
    assert recorder.notes[0] == "calibrate: 3 windows x 16 tokens on cpu: as given"
    assert re.fullmatch(r"calibrate: 48/144 tokens in \d+\.\d s \(\d+ tokens/s\); about \d+ s left", recorder.notes[1])
    assert (stats.params["calib_samples"], stats.params["calib_seq_len"], stats.params["size_reason"]) == \
        (3, 16, "as given")


def test_the_cpu_default_is_what_a_cpu_calibration_runs() -> None:
    recorder = Recorder()
    stats = calibrate(builtin_dir("tiny-llama"), QuantConfig(kv_cache="int8"), recorder, device="cpu")
    assert stats.params["num_windows"] == CPU_SAMPLES
    assert (stats.params["calib_samples"], stats.params["calib_seq_len"]) == (CPU_SAMPLES, CPU_SEQ_LEN)
    assert recorder.notes[0].startswith(f"calibrate: {CPU_SAMPLES} windows x {CPU_SEQ_LEN} tokens on cpu: the CPU "
                                        "default; about ")


def test_eta_note_in_minutes_when_long() -> None:
    assert eta_note(100, 10_100, 10.0) == "calibrate: 100/10100 tokens in 10.0 s (10 tokens/s); about 16.7 min left"
    assert eta_note(100, 200, 2.0) == "calibrate: 100/200 tokens in 2.0 s (50 tokens/s); about 2 s left"


def test_the_progress_bar_shows_the_time_remaining() -> None:
    stream = io.StringIO()
    reporter = RichReporter(Console(file=stream, force_terminal=True, width=120, color_system=None))
    with reporter.task("calibrate", 100, unit="tokens") as advance:
        for _ in range(4):
            advance(10)
            time.sleep(0.15)  # the bar refreshes ten times a second
    text = stream.getvalue()
    assert re.search(r"calibrate .*\d+/100 tokens \d:\d\d:\d\d eta \d:\d\d:\d\d", text), text
    assert "calibrate: done" in text


def test_plan_says_the_calibration_size_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "builtin:tiny-llama", "--quant", "fp8", "--out", str(tmp_path / "out"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibration"]["device"] == "cpu"
    assert (report["calibration"]["samples"], report["calibration"]["seq_len"]) == (CPU_SAMPLES, CPU_SEQ_LEN)
    assert run(["plan", "builtin:tiny-llama", "--quant", "fp8", "--calib-seq-len", "96",
                "--out", str(tmp_path / "out")]) == 0
    assert f"Calibration: {CPU_SAMPLES} windows x 96 tokens on cpu: --calib-samples {CPU_SAMPLES} is the CPU " \
           "default; about" in " ".join(capsys.readouterr().out.split())
