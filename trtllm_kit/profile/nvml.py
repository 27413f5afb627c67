"""GPU telemetry: an NVML sampler at 10 Hz in its own thread (``docs/harness.md`` §6).

Each sample is timestamped with ``time.monotonic_ns()`` (the clock of the request records; a test may inject
another clock and wait). Energy comes
from the energy counter's delta, never from integrating power. Hardware or thermal clock-event reasons in
any sample inside a window mark that window invalid. Without NVML the sampler says why in one line and
records nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

INVALIDATING = {0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                0x80: "hw_power_brake_slowdown"}
RECORDED = {0x2: "applications_clocks", 0x4: "sw_power_cap", 0x10: "sync_boost", 0x100: "display_clock"}
TELEMETRY_COLUMNS = ("t_mono_ns", "gpu", "power_instant_mw", "power_avg_mw", "energy_mj", "sm_clock_mhz",
                     "mem_clock_mhz", "temp_c", "util_gpu", "util_mem", "mem_used_bytes", "clocks_event_reasons")


@dataclass
class Sample:
    """One reading of one GPU (None where the GPU does not support the query)."""

    t_mono_ns: int
    gpu: int
    power_instant_mw: float | None
    power_avg_mw: float | None
    energy_mj: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    temp_c: int | None
    util_gpu: int | None
    util_mem: int | None
    mem_used_bytes: int | None
    clocks_event_reasons: int | None


class NvmlSampler:
    """Samples every GPU (or ``gpus``) every ``period_s`` on a daemon thread, on a fixed grid of ``clock`` (ns).

    ``nvml``, ``clock`` and ``wait`` (how the thread waits for the next tick or for ``stop``) may be injected.
    """

    def __init__(self, period_s: float = 0.1, gpus: list[int] | None = None, nvml: ModuleType | Any = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 wait: Callable[[threading.Event, float], object] = threading.Event.wait) -> None:
        self.period_s, self.unavailable = period_s, ""
        self.clock, self.wait = clock, wait
        self.samples: list[Sample] = []
        self.nvml, self.handles, self.devices = nvml, [], []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            if self.nvml is None:
                import pynvml as nvml_module

                self.nvml = nvml_module
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            indices = gpus if gpus is not None else list(range(count))
            self.handles = [(i, self.nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
            self.devices = [self._describe(i, h) for i, h in self.handles]
            if not self.handles:
                self.unavailable = "no GPU found"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
            self.unavailable = f"{type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return not self.unavailable

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception:
            return None

    def _describe(self, index: int, handle: Any) -> dict[str, Any]:
        name = self._call("nvmlDeviceGetName", handle)
        return {"index": index, "name": name.decode() if isinstance(name, bytes) else name,
                "uuid": self._call("nvmlDeviceGetUUID", handle),
                "driver": self._call("nvmlSystemGetDriverVersion"),
                "power_limit_mw": self._call("nvmlDeviceGetEnforcedPowerLimit", handle),
                "memory_total_bytes": getattr(self._call("nvmlDeviceGetMemoryInfo", handle), "total", None)}

    def sample_once(self) -> list[Sample]:
        """Read every GPU once and append the samples."""
        now = self.clock()
        nvml, out = self.nvml, []
        for index, h in self.handles:
            instant = None
            fields = self._call("nvmlDeviceGetFieldValues", h, [nvml.NVML_FI_DEV_POWER_INSTANT])
            if fields and getattr(fields[0], "nvmlReturn", 1) == 0:
                instant = float(fields[0].value.uiVal)
            util = self._call("nvmlDeviceGetUtilizationRates", h)
            memory = self._call("nvmlDeviceGetMemoryInfo", h)
            out.append(Sample(now, index, instant, self._call("nvmlDeviceGetPowerUsage", h),
                              self._call("nvmlDeviceGetTotalEnergyConsumption", h),
                              self._call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM),
                              self._call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM),
                              self._call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
                              getattr(util, "gpu", None), getattr(util, "memory", None),
                              getattr(memory, "used", None),
                              self._call("nvmlDeviceGetCurrentClocksEventReasons", h)))
        self.samples.extend(out)
        return out

    def _loop(self) -> None:
        period_ns, next_ns = round(self.period_s * 1e9), self.clock()
        while not self._stop.is_set():
            self.sample_once()
            next_ns += period_ns
            self.wait(self._stop, max(0, next_ns - self.clock()) / 1e9)

    def start(self) -> NvmlSampler:
        """Start sampling (no-op when NVML is unavailable)."""
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and shut NVML down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.available:
            self._call("nvmlShutdown")

    def rows(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.samples]


def summarize_telemetry(samples: list[Sample], window_ns: tuple[int, int], output_tokens: int,
                        num_ok: int, period_s: float = 0.1) -> dict[str, Any]:
    """Energy, power, clocks and throttle verdict for one window (``docs/harness.md`` §6.4, §6.3, §10 gate 11).

    Arguments:
        samples: all samples of the run.
        window_ns: ``(T0, T1)`` monotonic ns.
        output_tokens: Σ OSL_obs of successful requests in the window.
        num_ok: successful requests in the window.
        period_s: the sampling period (for coverage).
    """
    t0, t1 = window_ns
    inside = [s for s in samples if t0 <= s.t_mono_ns <= t1]
    if not inside:
        return {"num_samples": 0}
    seconds = (t1 - t0) / 1e9
    energy_j = 0.0
    by_gpu: dict[int, list[Sample]] = {}
    for s in inside:
        by_gpu.setdefault(s.gpu, []).append(s)
    for gpu_samples in by_gpu.values():
        counters = [s.energy_mj for s in gpu_samples if s.energy_mj is not None]
        if len(counters) >= 2:
            energy_j += (counters[-1] - counters[0]) / 1000
    reasons = [s.clocks_event_reasons or 0 for s in inside]
    invalid = sorted({name for bit, name in INVALIDATING.items() for r in reasons if r & bit})
    recorded = {name: sum(bool(r & bit) for r in reasons) / len(reasons) for bit, name in RECORDED.items()}
    values = lambda key: [getattr(s, key) for s in inside if getattr(s, key) is not None]  # noqa: E731
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    expected = max(1.0, seconds / period_s) * len(by_gpu)
    return {
        "num_samples": len(inside), "coverage": min(1.0, len(inside) / expected),
        "energy_j": energy_j, "avg_power_w": energy_j / seconds if seconds else None,
        "j_per_output_token": energy_j / output_tokens if output_tokens and energy_j else None,
        "output_tokens_per_j": output_tokens / energy_j if energy_j else None,
        "j_per_request": energy_j / num_ok if num_ok and energy_j else None,
        "power_instant_w": {"mean": (m / 1000 if (m := mean(values("power_instant_mw"))) else None),
                            "max": max(values("power_instant_mw"), default=0) / 1000},
        "sm_clock_mhz": {"mean": mean(values("sm_clock_mhz")), "min": min(values("sm_clock_mhz"), default=None)},
        "mem_clock_mhz": {"mean": mean(values("mem_clock_mhz"))},
        "temp_c_max": max(values("temp_c"), default=None),
        "mem_used_bytes_max": max(values("mem_used_bytes"), default=None),
        "throttle_invalidating": invalid, "throttle_fraction": recorded, "valid": not invalid,
    }
