"""The NVML sampler with an injected fake NVML module (the only fake here: no GPU on this machine), and the
real NVML-absent path."""

from __future__ import annotations

import itertools
import time
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


def test_thread_samples_at_10_hz_and_shuts_down():
    fake = FakeNvml()
    sampler = NvmlSampler(nvml=fake).start()
    time.sleep(0.55)
    sampler.stop()
    per_gpu = len([s for s in sampler.samples if s.gpu == 0])
    assert 5 <= per_gpu <= 7 and fake.shutdown
    times = [s.t_mono_ns for s in sampler.samples if s.gpu == 0]
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
    assert all(80 < g < 130 for g in gaps)


def test_without_a_gpu_the_sampler_says_why_and_records_nothing():
    sampler = NvmlSampler().start()  # the real pynvml: this machine has no NVIDIA driver
    sampler.stop()
    assert not sampler.available and sampler.unavailable and sampler.samples == []
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("Driver Not Loaded")))
    assert NvmlSampler(nvml=broken).unavailable == "RuntimeError: Driver Not Loaded"
