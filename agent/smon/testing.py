"""Test doubles for what a CPU-only machine lacks: NVML (`FakeNvml`) and CUDA events (`FakeCuda`).

`FakeNvml` has the same function names, constants and error behaviour as `pynvml` for everything
the sampler calls, so `smon.nvml.GpuSampler` runs unchanged against it. The server's tests and the
demo use it too: `smon.attach(..., nvml=FakeNvml.throttled())`, or in a child process
`SMON_FAKE_NVML=throttled` (see `FakeNvml.from_spec`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields, replace
from types import SimpleNamespace
from typing import Any, ClassVar

# Clock-event (throttle) reason bits, as in NVML's nvmlClocksEventReason*.
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80


@dataclass
class FakeGpu:
    """One fake GPU's readings; change attributes at any time to change later samples."""

    sm_clock: int = 1980
    sm_clock_max: int = 1980
    mem_clock: int = 2619
    mem_clock_max: int = 2619
    gpu_util: int = 97
    mem_util: int = 41
    mem_used: int = 60 * 2**30
    mem_total: int = 80 * 2**30
    temperature: int = 62
    power_mw: int = 610_000
    power_limit_mw: int = 700_000
    throttle_reasons: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    pcie_replay: int = 0
    xid_events: list[int] = field(default_factory=list)  # pending, consumed by event-set reads


class _NvmlError(Exception):
    """pynvml.NVMLError-shaped: carries the NVML return code in `.value`."""

    _NAMES: ClassVar[dict[int, str]] = {
        3: "Not Supported",
        4: "Insufficient Permissions",
        10: "Timeout",
        12: "NVML Shared Library Not Found",
        9: "Driver Not Loaded",
        13: "Function Not Found",
    }

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._NAMES.get(self.value, f"NVML error {self.value}")


class FakeNvml:
    """A pynvml stand-in. `missing` names NVML functions that raise NVMLError(Not Supported)."""

    NVMLError = _NvmlError
    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(
        self,
        gpus: int | list[FakeGpu] = 1,
        *,
        missing: set[str] | frozenset[str] | tuple[str, ...] = (),
        no_driver: bool = False,
        uuid_prefix: str = "GPU-fake",
        **gpu_fields: Any,
    ) -> None:
        if isinstance(gpus, int):
            gpus = [FakeGpu(**gpu_fields) for _ in range(gpus)]
        self.gpus = gpus
        self.missing = set(missing)
        self.no_driver = no_driver
        self.uuids = [f"{uuid_prefix}-{i:04d}-0000-0000-000000000000" for i in range(len(gpus))]
        self.initialized = False
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    # -- presets --------------------------------------------------------------------------------
    @classmethod
    def healthy(cls, gpus: int = 1) -> FakeNvml:
        return cls(gpus)

    @classmethod
    def throttled(cls, gpus: int = 1) -> FakeNvml:
        """A hot GPU held well below its max SM clock by thermal slowdown."""
        return cls(
            gpus,
            sm_clock=1200,
            temperature=91,
            power_mw=690_000,
            throttle_reasons=SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN,
        )

    @classmethod
    def ecc_errors(cls, gpus: int = 1) -> FakeNvml:
        return cls(gpus, ecc_corrected=120, ecc_uncorrected=2, xid_events=[48])

    @classmethod
    def from_spec(cls, spec: str, gpus: int = 1) -> FakeNvml:
        """Parse SMON_FAKE_NVML: comma-separated `healthy`, `throttled`, `ecc`, `no_driver`,
        `missing=fnA+fnB`, or `field=value` for any FakeGpu field (e.g. `temperature=85`)."""
        gpu = FakeGpu()
        missing: set[str] = set()
        no_driver = False
        names = {f.name for f in fields(FakeGpu)}
        for raw in spec.split(","):
            item = raw.strip()
            if not item or item in ("1", "healthy", "true"):
                continue
            if item == "throttled":
                gpu = replace(
                    gpu,
                    sm_clock=1200,
                    temperature=91,
                    throttle_reasons=SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN,
                )
            elif item == "ecc":
                gpu = replace(gpu, ecc_corrected=120, ecc_uncorrected=2, xid_events=[48])
            elif item == "no_driver":
                no_driver = True
            elif item.startswith("missing="):
                missing.update(x for x in item[len("missing=") :].split("+") if x)
            elif "=" in item and item.split("=", 1)[0] in names:
                key, value = item.split("=", 1)
                setattr(gpu, key, int(value, 0))
            else:
                raise ValueError(f"unknown SMON_FAKE_NVML item {item!r}")
        return cls(
            [replace(gpu, xid_events=list(gpu.xid_events)) for _ in range(gpus)],
            missing=missing,
            no_driver=no_driver,
        )

    # -- plumbing -------------------------------------------------------------------------------
    def _enter(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.missing:
            raise _NvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        if name != "nvmlInit" and not self.initialized:
            raise _NvmlError(1)  # Uninitialized

    def _gpu(self, handle: Any) -> FakeGpu:
        return self.gpus[handle.index]

    # -- the pynvml surface used by smon.nvml --------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.no_driver:
            raise _NvmlError(self.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _NvmlError(2)  # Invalid Argument
        return SimpleNamespace(index=index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._enter("nvmlDeviceGetHandleByUUID")
        if uuid not in self.uuids:
            raise _NvmlError(6)  # Not Found
        return SimpleNamespace(index=self.uuids.index(uuid))

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex")
        return int(handle.index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        return self.uuids[handle.index]

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo")
        gpu = self._gpu(handle)
        return gpu.sm_clock if clock == self.NVML_CLOCK_SM else gpu.mem_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo")
        gpu = self._gpu(handle)
        return gpu.sm_clock_max if clock == self.NVML_CLOCK_SM else gpu.mem_clock_max

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        gpu = self._gpu(handle)
        return SimpleNamespace(gpu=gpu.gpu_util, memory=gpu.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle)
        return SimpleNamespace(used=gpu.mem_used, total=gpu.mem_total, free=gpu.mem_total - gpu.mem_used)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature")
        return self._gpu(handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        return self._gpu(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit")
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        return self._gpu(handle).throttle_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors")
        gpu = self._gpu(handle)
        corrected = error_type == self.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return gpu.ecc_corrected if corrected else gpu.ecc_uncorrected

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter")
        return self._gpu(handle).pcie_replay

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return SimpleNamespace(handles=[])

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        event_set.handles.append(handle)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        with self._lock:
            for handle in event_set.handles:
                gpu = self._gpu(handle)
                if gpu.xid_events:
                    return SimpleNamespace(
                        device=handle,
                        eventType=self.nvmlEventTypeXidCriticalError,
                        eventData=gpu.xid_events.pop(0),
                        gpuInstanceId=0,
                        computeInstanceId=0,
                    )
        raise _NvmlError(self.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree")

    def inject_xid(self, xid: int, gpu: int = 0) -> None:
        with self._lock:
            self.gpus[gpu].xid_events.append(xid)


class FakeCudaEvent:
    """torch.cuda.Event-shaped: stamped with the fake device clock when recorded."""

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False) -> None:
        self._cuda = cuda
        self.stream: Any = None
        self.device_ms: float | None = None
        self.seq = -1

    def record(self, stream: Any = None) -> None:
        self.stream = stream
        self.seq, self.device_ms = self._cuda._stamp()

    def query(self) -> bool:
        self._cuda.queries += 1
        return self.done()

    def done(self) -> bool:
        return self.seq >= 0 and self._cuda._completed(self)

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        if not (self.done() and end.done()):  # (not counted as queries: torch's does not query)
            raise RuntimeError("fake CUDA: elapsed_time on an event that has not completed")
        assert self.device_ms is not None and end.device_ms is not None
        return end.device_ms - self.device_ms

    def synchronize(self) -> None:
        raise AssertionError("smon must never synchronize on a CUDA event")


class FakeCuda:
    """torch.cuda-shaped module for CudaClock: `Event`, `current_stream`, a controllable device clock.

    Events complete only when the test says so (`complete_all()`), and their device timestamps come
    from `device_ms`, which the test advances (`advance(ms)`), so CPU and "GPU" time can differ.
    """

    def __init__(self) -> None:
        self.device_ms = 0.0
        self.completed = 0  # events with seq < completed have completed
        self.recorded = 0
        self.queries = 0
        self.created = 0  # Event() constructions
        self.stream_lookups = 0  # current_stream() calls
        self._lock = threading.Lock()
        self.stream = SimpleNamespace(name="fake-stream")

    def Event(self, enable_timing: bool = False) -> FakeCudaEvent:  # named like torch.cuda.Event
        self.created += 1
        return FakeCudaEvent(self, enable_timing)

    def current_stream(self, device: Any = None) -> Any:
        self.stream_lookups += 1
        return self.stream

    def synchronize(self, device: Any = None) -> None:
        raise AssertionError("smon must never call torch.cuda.synchronize()")

    def advance(self, ms: float) -> None:
        with self._lock:
            self.device_ms += ms

    def complete_all(self) -> None:
        with self._lock:
            self.completed = self.recorded

    def _stamp(self) -> tuple[int, float]:
        with self._lock:
            seq = self.recorded
            self.recorded += 1
            return seq, self.device_ms

    def _completed(self, event: FakeCudaEvent) -> bool:
        return event.seq < self.completed


class SimulatedCuda(FakeCuda):
    """A device that runs on its own: one stream whose kernels (`launch(ms)`) queue behind each
    other from the moment the host issues them, in real time. An event runs when the device
    reaches it (at the host's time of recording, or when the kernels before it finish) and has
    completed once that time has passed; `wait()` blocks the host until the device is idle, as a
    synchronising call (`loss.item()`, gloo on CUDA tensors) would. With it a CPU job has a real
    host time line and a device time line that can differ (tests of device time hidden behind
    the host, tests/e2e/test_device_time.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._origin = time.perf_counter()
        self._busy_until = 0.0  # ms on the device clock (ms since the origin)

    def _now_ms(self) -> float:
        return (time.perf_counter() - self._origin) * 1000.0

    def launch(self, ms: float) -> None:
        """Queue a kernel of `ms` milliseconds."""
        with self._lock:
            self._busy_until = max(self._busy_until, self._now_ms()) + ms

    def wait(self) -> None:
        """Block the host until every kernel issued so far has run."""
        with self._lock:
            left = self._busy_until - self._now_ms()
        if left > 0:
            time.sleep(left / 1000.0)

    def _stamp(self) -> tuple[int, float]:
        with self._lock:
            seq = self.recorded
            self.recorded += 1
            return seq, max(self._now_ms(), self._busy_until)

    def _completed(self, event: FakeCudaEvent) -> bool:
        return event.device_ms is not None and event.device_ms <= self._now_ms()
