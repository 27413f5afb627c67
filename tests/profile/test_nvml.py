"""The NVML sampler with an injected fake NVML module (the only fake here: no GPU on this machine), and the
real NVML-absent path."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from trtllm_kit.profile.nvml import NvmlSampler, summarize_telemetry


class FakeNvml:
    """Two GPUs; energy grows 100 J per read; GPU 1 reports HW thermal slowdown (0x40) on its third read."""

    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self) -> None:
        self.reads = {0: 0, 1: 0}
        self.shutdown = False

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shutdown = True
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return b"Fake H100"
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h}"
    def nvmlSystemGetDriverVersion(self): return "560.35.03"
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return 700_000
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=40 << 30, total=80 << 30)
    def nvmlDeviceGetPowerUsage(self, h): return 350_000
    def nvmlDeviceGetClockInfo(self, h, kind): return 1980 if kind == self.NVML_CLOCK_SM else 2619
    def nvmlDeviceGetTemperature(self, h, kind): return 60 + h
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetFieldValues(self, h, ids):
        assert ids == [self.NVML_FI_DEV_POWER_INSTANT]
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=400_000 + 1000 * h))]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.reads[h] += 1
        return 1_000_000 + 100_000 * self.reads[h]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x40 if h == 1 and self.reads[h] == 3 else 0x1


def test_samples_every_field_and_computes_energy_per_token():
    fake = FakeNvml()
    sampler = NvmlSampler(nvml=fake)
    assert sampler.available and [d["name"] for d in sampler.devices] == ["Fake H100", "Fake H100"]
    for _ in range(2):
        sampler.sample_once()
    first = sampler.samples[0]
    assert (first.gpu, first.power_instant_mw, first.power_avg_mw) == (0, 400_000.0, 350_000)
    assert first.energy_mj == 1_100_000
    assert (first.sm_clock_mhz, first.mem_clock_mhz, first.temp_c, first.util_gpu) == (1980, 2619, 60, 97)
    window = (sampler.samples[0].t_mono_ns, sampler.samples[-1].t_mono_ns)
    summary = summarize_telemetry(sampler.samples, window, output_tokens=1000, num_ok=10)
    assert summary["energy_j"] == 200.0  # 100 J per GPU between the two reads: counter delta, no integration
    assert summary["j_per_output_token"] == 0.2 and summary["j_per_request"] == 20.0
    assert summary["valid"] and summary["throttle_invalidating"] == []


def test_thermal_throttling_invalidates_the_window():
    sampler = NvmlSampler(nvml=FakeNvml())
    for _ in range(3):
        sampler.sample_once()
    window = (sampler.samples[0].t_mono_ns, sampler.samples[-1].t_mono_ns)
    summary = summarize_telemetry(sampler.samples, window, 10, 1)
    assert not summary["valid"] and summary["throttle_invalidating"] == ["hw_thermal_slowdown"]
    # a window that ends before the throttled sample stays valid
    early = summarize_telemetry(sampler.samples[:4], (window[0], sampler.samples[3].t_mono_ns), 10, 1)
    assert early["valid"]


class SteppedTime:
    """A clock that moves only when the sampler waits, by the time it asks for, plus ``slow_ns`` on the reads
    ``slow_at`` (a sample that took long). After ``ticks`` waits it parks the sampler until ``stop``."""

    def __init__(self, ticks: int, slow_at: frozenset[int] = frozenset(), slow_ns: int = 0) -> None:
        self.now_ns, self.reads, self.waits = 7_000_000_000, 0, []
        self.ticks, self.slow_at, self.slow_ns = ticks, slow_at, slow_ns
        self.parked = threading.Event()

    def clock(self) -> int:
        self.reads += 1
        if self.reads in self.slow_at:
            self.now_ns += self.slow_ns
        return self.now_ns

    def wait(self, stop: threading.Event, seconds: float) -> None:
        self.waits.append(seconds)
        self.now_ns += round(seconds * 1e9)
        if len(self.waits) == self.ticks:
            self.parked.set()
            stop.wait(30)  # hang guard only: the test stops the sampler at once


def test_thread_samples_every_gpu_on_a_10_hz_grid_and_shuts_down():
    fake, steps = FakeNvml(), SteppedTime(ticks=6)
    sampler = NvmlSampler(nvml=fake, clock=steps.clock, wait=steps.wait).start()
    assert steps.parked.wait(30)
    sampler.stop()
    assert fake.shutdown and not any(t.name == "nvml-sampler" for t in threading.enumerate())
    assert [s.gpu for s in sampler.samples] == [0, 1] * 6  # one sample per GPU per tick, in order
    start = sampler.samples[0].t_mono_ns
    assert [s.t_mono_ns for s in sampler.samples[::2]] == [start + i * 100_000_000 for i in range(6)]
    assert steps.waits == [0.1] * 6
    count = len(sampler.samples)
    sampler.stop()  # a second stop is harmless and nothing samples after the first
    assert len(sampler.samples) == count


def test_a_slow_sample_keeps_the_grid_instead_of_shifting_it():
    # the clock's 3rd read comes right after the first sample: that sample took 250 ms
    steps = SteppedTime(ticks=5, slow_at=frozenset({3}), slow_ns=250_000_000)
    sampler = NvmlSampler(nvml=FakeNvml(), gpus=[0], clock=steps.clock, wait=steps.wait).start()
    assert steps.parked.wait(30)
    sampler.stop()
    start = sampler.samples[0].t_mono_ns
    offsets_ms = [(s.t_mono_ns - start) / 1e6 for s in sampler.samples]
    assert offsets_ms == [0, 250, 250, 300, 400]  # the two missed ticks at once, then back on the 100 ms grid
    assert steps.waits == [0.0, 0.0, 0.05, 0.1, 0.1]


def test_without_a_gpu_the_sampler_says_why_and_records_nothing():
    sampler = NvmlSampler().start()  # the real pynvml: this machine has no NVIDIA driver
    sampler.stop()
    assert not sampler.available and sampler.unavailable and sampler.samples == []
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("Driver Not Loaded")))
    assert NvmlSampler(nvml=broken).unavailable == "RuntimeError: Driver Not Loaded"
