"""The training process's side of shipping: one daemon thread, `smon-feeder`.

It collects the steps the training thread has ended (`StepTracker.collect`: raw tuples into
RawSteps) into the record queue, drains that every `feed_interval` (sooner when a full batch is
waiting), turns RawSteps into wire `StepRecord`s (`records.py`; CUDA steps wait here until their events have
completed), and hands the outlet an envelope: a `Batch` carrying the records, the current
heartbeat and the training side's counters. With nothing to hand over it still sends the
heartbeat every half heartbeat interval, so the shipper always has a fresh one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from smon.config import AgentConfig
from smon.errors import ErrorCounter
from smon.outlet import Outlet
from smon.record_queue import RecordQueue
from smon.records import release_marks, to_step_record
from smon.steps import RawStep
from smon.v1 import ingest_pb2 as pb


def _none() -> int:
    return 0


class Feeder:
    def __init__(
        self,
        config: AgentConfig,
        records: RecordQueue,
        heartbeat: Callable[[], pb.Heartbeat],
        errors: ErrorCounter,
        outlet: Outlet,
        *,
        outlet_factory: Callable[[], Outlet] | None = None,
        collect: Callable[[], None] | None = None,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self._config = config
        self._records = records
        self._heartbeat = heartbeat
        self._errors = errors
        self.outlet = outlet
        self._outlet_factory = outlet_factory  # to replace a shipper process that died
        self._collect = collect  # moves ended steps into `records`
        self._backlog = backlog or _none  # ended steps not collected yet
        self._outlet_started = time.monotonic()
        self.lost = 0  # records handed to an outlet that was gone
        self.restart_interval = 30.0  # at most one new shipper process per this many seconds
        self._pending: list[RawStep] = []  # device steps whose events have not completed yet
        self._gpu_uuid = ""
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one feed at a time (the thread, or close())
        self._thread: threading.Thread | None = None
        self.feed_interval = max(0.005, min(0.2, config.flush_interval / 2))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="smon-feeder", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._kick.set()

    def set_gpu_uuid(self, gpu_uuid: str) -> None:
        self._gpu_uuid = gpu_uuid

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self, timeout: float) -> bool:
        """Hand over everything held (device steps read by host time if still pending), then close
        the outlet, which flushes for at most `timeout` seconds."""
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        try:
            self.feed(force=True)  # at least once: the last heartbeat
            while len(self._records) or self._backlog() or self._pending:
                self.feed(force=True)
        except Exception as exc:
            self._errors.report("feeder", exc)
        return self.outlet.close(timeout, final=True)

    def _run(self) -> None:
        last_sent = 0.0
        heartbeat_every = max(0.01, self._config.heartbeat_interval / 2)
        while not self._stop.is_set():
            if len(self._records) + self._backlog() < self._config.max_batch_records:  # else go on
                self._kick.wait(self.feed_interval)
                self._kick.clear()
            if self._stop.is_set():
                break
            try:
                if (
                    len(self._records)
                    or self._backlog()
                    or self._pending
                    or time.monotonic() - last_sent >= heartbeat_every
                ):
                    self.feed(force=False)
                    last_sent = time.monotonic()
            except Exception as exc:
                self._errors.report("feeder", exc)

    def feed(self, *, force: bool) -> None:
        """One envelope: up to a batch of records, the heartbeat, the counters."""
        with self._lock:
            if self._collect is not None:
                try:
                    self._collect()
                except Exception as exc:
                    self._errors.report("collect", exc)
            cfg = self._config
            items: list[Any] = self._pending
            self._pending = []
            items.extend(self._records.drain(max(0, cfg.max_batch_records - len(items))))
            envelope = pb.Batch()
            waiting = False  # a device step is still in flight: so are the ones after it
            for item in items:
                if isinstance(item, pb.GpuSample):
                    envelope.gpu_samples.append(item)
                    continue
                if waiting and not force:
                    self._pending.append(item)
                    continue
                try:
                    record = to_step_record(
                        item,
                        gc_span_min_seconds=cfg.gc_span_min_seconds,
                        force=force,
                        timeout=cfg.cuda_resolve_timeout,
                    )
                except Exception as exc:
                    self._errors.report("step_record", exc)
                    continue
                if record is None:
                    self._pending.append(item)
                    waiting = True
                else:
                    envelope.steps.append(record)
                    if item.read_on_device:
                        try:
                            release_marks(item)
                        except Exception as exc:
                            self._errors.report("release_marks", exc)
            try:
                envelope.heartbeat.CopyFrom(self._heartbeat())
            except Exception as exc:
                self._errors.report("heartbeat", exc)
            envelope.counters.CopyFrom(
                pb.AgentCounters(
                    dropped_records=self._records.dropped + self.lost,
                    errors=self._errors.count,
                    queued=len(self._records) + self._backlog() + len(self._pending),
                )
            )
            if self._gpu_uuid:
                envelope.coords.gpu_uuid = self._gpu_uuid
            try:
                self.outlet.send(envelope)
            except OSError as exc:  # the shipper process is gone (killed, crashed)
                self.lost += len(envelope.steps) + len(envelope.gpu_samples)
                self._errors.report("shipper_process", exc)
                self._replace_outlet()

    def _replace_outlet(self) -> None:
        """Start a new shipper process, at most once per `restart_interval` (records meanwhile are lost)."""
        if self._outlet_factory is None or self._stop.is_set():
            return
        if time.monotonic() - self._outlet_started < self.restart_interval:
            return
        self._outlet_started = time.monotonic()
        self.outlet = self._outlet_factory()
