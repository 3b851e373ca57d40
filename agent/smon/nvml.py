"""GPU health sampler: one NVML reading of this rank's GPU every `SMON_NVML_INTERVAL` seconds.

Runs on its own daemon thread (NVML calls take tens of microseconds to milliseconds and must never
run on the training thread). `pynvml` (nvidia-ml-py) is imported only when the thread starts. Any
object with the same function names can stand in for it (`smon.testing.FakeNvml`), so this exact
code runs in tests. No library, no driver, no GPU, or a field the device does not support: the
sampler says so once (INFO) and carries on with what it can read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from smon.errors import ErrorCounter, OnceLog
from smon.v1 import ingest_pb2 as pb

logger = logging.getLogger("smon")

_MAX_XIDS_PER_SAMPLE = 32


def _milli(value: Any) -> float:
    return float(value) / 1000.0


# field group -> reader(nvml, handle) -> {GpuSample field: value}. One NVML call per group, so a
# field the device lacks only removes its own group.
_READERS: dict[str, Callable[[Any, Any], dict[str, Any]]] = {
    "sm_clock": lambda n, h: {"sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)},
    "sm_clock_max": lambda n, h: {"sm_clock_max_mhz": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)},
    "mem_clock": lambda n, h: {"mem_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)},
    "mem_clock_max": lambda n, h: {"mem_clock_max_mhz": n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)},
    "utilization": lambda n, h: (lambda u: {"gpu_util": u.gpu, "mem_util": u.memory})(
        n.nvmlDeviceGetUtilizationRates(h)
    ),
    "memory": lambda n, h: (lambda m: {"mem_used_bytes": m.used, "mem_total_bytes": m.total})(
        n.nvmlDeviceGetMemoryInfo(h)
    ),
    "temperature": lambda n, h: {"temperature_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)},
    "power": lambda n, h: {"power_w": _milli(n.nvmlDeviceGetPowerUsage(h))},
    "power_limit": lambda n, h: {"power_limit_w": _milli(n.nvmlDeviceGetEnforcedPowerLimit(h))},
    "throttle_reasons": lambda n, h: {
        "throttle_reasons": (
            n.nvmlDeviceGetCurrentClocksEventReasons(h)
            if hasattr(n, "nvmlDeviceGetCurrentClocksEventReasons")
            else n.nvmlDeviceGetCurrentClocksThrottleReasons(h)  # drivers / bindings before the rename
        )
    },
    "ecc_corrected": lambda n, h: {
        "ecc_corrected": n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
        )
    },
    "ecc_uncorrected": lambda n, h: {
        "ecc_uncorrected": n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
        )
    },
    "pcie_replay": lambda n, h: {"pcie_replay": n.nvmlDeviceGetPcieReplayCounter(h)},
}
_INTEGER_FIELDS = frozenset({"throttle_reasons", "ecc_corrected", "ecc_uncorrected", "pcie_replay"})


class GpuSampler:
    """Samples one GPU (the one this rank uses) on a background thread."""

    def __init__(
        self,
        sink: Callable[[pb.GpuSample], None],
        errors: ErrorCounter,
        *,
        interval: float,
        nvml: Any = None,
        local_rank: int = 0,
        gpu_uuid: str = "",
        on_gpu_uuid: Callable[[str], None] | None = None,
    ) -> None:
        self._sink = sink
        self._errors = errors
        self._interval = interval
        self._nvml = nvml
        self._local_rank = local_rank
        self._gpu_uuid_hint = gpu_uuid
        self._on_gpu_uuid = on_gpu_uuid
        self._once = OnceLog()
        self._disabled: set[str] = set()
        self._xid_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.gpu_index = -1
        self.gpu_uuid = ""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="smon-nvml", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        nvml = self._load()
        if nvml is None:
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self._once(
                "init", logging.INFO, "smon: NVML unavailable (%s); GPU health will not be sampled", exc
            )
            return
        try:
            handle = self.open_device(nvml)
            if handle is None:
                return
            while not self._stop.is_set():
                try:
                    self._sink(self.sample(nvml, handle))
                except Exception as exc:
                    self._errors.report("nvml_sample", exc)
                self._stop.wait(self._interval)
        except Exception as exc:
            self._errors.report("nvml_sampler", exc)
        finally:
            self._shutdown(nvml)

    def _load(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml
        except Exception as exc:
            self._once(
                "import",
                logging.INFO,
                "smon: nvidia-ml-py (pynvml) not importable (%s); GPU health will not be sampled",
                exc,
            )
            return None
        return pynvml

    def _shutdown(self, nvml: Any) -> None:
        try:
            if self._xid_set is not None:
                nvml.nvmlEventSetFree(self._xid_set)
                self._xid_set = None
            nvml.nvmlShutdown()
        except Exception:
            pass

    # -- device -------------------------------------------------------------------------------
    def open_device(self, nvml: Any) -> Any:
        """Find this rank's GPU; None (said once) when there is none."""
        count = nvml.nvmlDeviceGetCount()
        if count <= 0:
            self._once("no_gpu", logging.INFO, "smon: NVML sees no GPU; GPU health will not be sampled")
            return None
        handle, index = self._pick(nvml, count)
        self.gpu_index = index
        try:
            self.gpu_uuid = str(nvml.nvmlDeviceGetUUID(handle))
        except Exception as exc:
            self._once("uuid", logging.INFO, "smon: GPU UUID not readable (%s)", exc)
        if self.gpu_uuid and self._on_gpu_uuid is not None:
            self._on_gpu_uuid(self.gpu_uuid)
        self._setup_xid(nvml, handle)
        return handle

    def _pick(self, nvml: Any, count: int) -> tuple[Any, int]:
        """This rank's GPU: by UUID when torch told us, else via CUDA_VISIBLE_DEVICES / LOCAL_RANK."""
        uuid = self._gpu_uuid_hint
        if not uuid:
            visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
            if self._local_rank < len(visible):
                entry = visible[self._local_rank]
                if entry.isdigit():
                    index = int(entry) % count
                    return nvml.nvmlDeviceGetHandleByIndex(index), index
                uuid = entry  # GPU-... / MIG-... entries name the device by UUID
        if uuid:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                try:
                    index = int(nvml.nvmlDeviceGetIndex(handle))
                except Exception:
                    index = 0
                return handle, index
            except Exception as exc:
                self._once(
                    "by_uuid",
                    logging.INFO,
                    "smon: GPU %s not found by UUID (%s); using LOCAL_RANK",
                    uuid,
                    exc,
                )
        index = self._local_rank % count
        return nvml.nvmlDeviceGetHandleByIndex(index), index

    def _setup_xid(self, nvml: Any, handle: Any) -> None:
        try:
            event_set = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            self._xid_set = event_set
        except Exception as exc:
            self._once(
                "xid",
                logging.INFO,
                "smon: XID events not readable on this GPU (%s); sampling continues without them",
                exc,
            )

    # -- one reading --------------------------------------------------------------------------
    def sample(self, nvml: Any, handle: Any) -> pb.GpuSample:
        sample = pb.GpuSample(time=time.time(), gpu_index=max(0, self.gpu_index), gpu_uuid=self.gpu_uuid)
        for group, reader in _READERS.items():
            if group in self._disabled:
                continue
            try:
                values = reader(nvml, handle)
            except Exception as exc:
                # Not supported / no permission / missing in these bindings: permanent for this
                # device, so stop asking (and say it once).
                self._disabled.add(group)
                self._once(
                    f"field:{group}",
                    logging.INFO,
                    "smon: GPU %d: %s not available (%s); sampling continues without it",
                    self.gpu_index,
                    group,
                    exc,
                )
                continue
            for name, value in values.items():
                setattr(sample, name, int(value) if name in _INTEGER_FIELDS else float(value))
        if self._xid_set is not None:
            sample.xid_events.extend(self._read_xids(nvml))
        return sample

    def _read_xids(self, nvml: Any) -> list[int]:
        xids: list[int] = []
        for _ in range(_MAX_XIDS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait_v2(self._xid_set, 0)
            except Exception as exc:
                if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_TIMEOUT", 10):
                    self._once(
                        "xid_read",
                        logging.INFO,
                        "smon: reading XID events failed (%s); sampling continues without them",
                        exc,
                    )
                    self._xid_set = None
                break
            xids.append(int(data.eventData))
        return xids
