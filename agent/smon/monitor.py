"""The handle `smon.attach()` returns: the public surface of the agent.

`Monitor` itself records nothing: it is what attach returns when SMon is disabled
(`enable=False`, `SMON_DISABLE=1`) or could not start, so every call site keeps working and costs
nothing. `ActiveMonitor` is the real agent: it owns the step tracker, the hooks, the GC watch, the
GPU sampler and the shipper, and guards every public call so training never sees an exception.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Literal

from smon.config import AgentConfig
from smon.dataloader import DataWaitTimer
from smon.errors import ErrorCounter, OnceLog
from smon.feeder import Feeder
from smon.gc_watch import GcWatch
from smon.nvml import GpuSampler
from smon.outlet import start_outlet
from smon.record_queue import RecordQueue
from smon.seqstats import capture_explicit
from smon.steps import MAX_SPANS_PER_STEP, StepTracker
from smon.timing import Clock, Mark
from smon.v1 import ingest_pb2 as pb

logger = logging.getLogger("smon")

_NULL_SCOPE: AbstractContextManager[None] = contextlib.nullcontext()


class Monitor:
    """A monitor that records nothing. Every method is safe to call from the training loop."""

    enabled = False

    def step(self, step: int | None = None) -> None:
        """End the step in progress (loops without an attached optimizer).

        `step`, if given, is the number of the step that ends here; the next one is `step + 1`.
        """

    def set_step(self, step: int) -> None:
        """Number the step in progress `step` (e.g. after restoring a checkpoint)."""

    def phase(self, name: str, microbatch: int | None = None, chunk: int = 0) -> AbstractContextManager[Any]:
        """`with mon.phase("checkpoint"):` times the block as a span of kind `name`."""
        return _NULL_SCOPE

    def record_batch(self, seq_lens: Any, microbatch: int | None = None) -> None:
        """Record the sequence lengths of one micro-batch (default: the current / next forward)."""

    def close(self, timeout: float | None = None) -> None:
        """Stop recording and flush what is held, for at most `timeout` seconds."""

    def counters(self) -> dict[str, int]:
        """The agent's own health: dropped records, errors, queued records, batches sent / acked."""
        return {}

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _PhaseScope:
    """Context manager of `ActiveMonitor.phase` (a class, not a generator: cheaper per use)."""

    __slots__ = ("_chunk", "_microbatch", "_monitor", "_name", "_start")

    def __init__(self, monitor: ActiveMonitor, name: str, microbatch: int | None, chunk: int) -> None:
        self._monitor = monitor
        self._name = name
        self._microbatch = microbatch
        self._chunk = chunk
        self._start: Mark | None = None

    def __enter__(self) -> _PhaseScope:
        tracker = self._monitor.tracker
        if tracker.active:
            try:
                self._start = tracker.open(self._name)
            except Exception as exc:
                self._monitor.errors.report("phase", exc)
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        start, self._start = self._start, None
        if start is not None:
            try:
                self._monitor.tracker.close(self._name, start, self._microbatch, self._chunk)
            except Exception as exc:
                self._monitor.errors.report("phase", exc)
        return False  # never swallow the user's exception


# Monitors alive in this process, so a fork child (DataLoader workers) can switch them off.
_LIVE: weakref.WeakSet[ActiveMonitor] = weakref.WeakSet()
_FORK_HANDLER = threading.Lock()
_fork_handler_installed = False


def _after_fork_in_child() -> None:
    for monitor in list(_LIVE):
        monitor._disable_in_fork_child()


class ActiveMonitor(Monitor):
    """The live agent of this rank."""

    enabled = True

    def __init__(
        self,
        *,
        config: AgentConfig,
        coords: pb.Coordinates,
        clock: Clock,
        start_step: int = 0,
        nvml: Any = None,
        local_rank: int = 0,
        gpu_uuid: str = "",
    ) -> None:
        self.config = config
        self.job = coords.job
        self.rank = coords.rank
        self.errors = ErrorCounter()
        self.once = OnceLog()
        self._closed = False
        self._close_lock = threading.Lock()
        self._gc = GcWatch(self.errors)
        self._coords = coords
        self._records = RecordQueue(
            config.queue_size, threshold=config.max_batch_records, on_threshold=self._kick_feeder
        )
        self.tracker = StepTracker(
            clock,
            start_step=start_step,
            capacity=config.queue_size,
            gc_drain=self._gc.drain,
            on_overflow=self._on_span_overflow,
            on_backlog=self._kick_feeder,
            backlog=config.max_batch_records,
        )
        self.feeder: Feeder | None = None  # created by start(): it starts the shipper process
        self._sampler: GpuSampler | None = None
        if config.nvml_interval > 0:
            self._sampler = GpuSampler(
                self._records.put,
                self.errors,
                interval=config.nvml_interval,
                nvml=nvml,
                local_rank=local_rank,
                gpu_uuid=gpu_uuid,
                on_gpu_uuid=self._on_gpu_uuid,
            )
        self._removables: list[Any] = []  # ModelHooks / OptimizerHooks with remove()
        self._data_timer: DataWaitTimer | None = None
        self.optimizer_driven = False

    # -- wiring (attach) ------------------------------------------------------------------------
    def instrument(self, models: Sequence[Any], optimizer: Any, dataloader: Any) -> None:
        """Install hooks on what attach was given; each failure is said and skipped, not raised."""
        if models:
            from smon.hooks import ModelHooks

            for chunk, module in enumerate(models):
                try:
                    hooks = ModelHooks(module, chunk, self.tracker, self.errors)
                    hooks.install()
                    self._removables.append(hooks)
                except Exception as exc:
                    self.errors.report("model_hooks", exc)
        if optimizer is not None:
            from smon.hooks import OptimizerHooks

            try:
                opt_hooks = OptimizerHooks(optimizer, self.tracker, self.errors)
                opt_hooks.install()
                self._removables.append(opt_hooks)
                self.optimizer_driven = True
            except Exception as exc:
                self.errors.report("optimizer_hooks", exc)
        if dataloader is not None:
            try:
                self._data_timer = DataWaitTimer(self.tracker, self.errors, self.once)
                self._data_timer.wrap_loader(dataloader)
            except Exception as exc:
                self.errors.report("dataloader", exc)

    def start(self) -> None:
        global _fork_handler_installed
        if any(m is not self and not m._closed for m in list(_LIVE)):
            logger.warning(
                "smon: another SMon monitor is already attached in this process; both record "
                "(close the first one, or attach once)"
            )
        _LIVE.add(self)  # before any thread starts: a fork from now on switches this monitor off
        with _FORK_HANDLER:
            if not _fork_handler_installed and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_handler_installed = True
        atexit.register(self._close_at_exit)
        self._gc.install()
        self.feeder = Feeder(
            self.config,
            self._records,
            self.tracker.heartbeat,
            self.errors,
            self._new_outlet(),
            outlet_factory=self._new_outlet,
            collect=self._collect_steps,
            backlog=self._steps_waiting,
        )
        self.feeder.start()
        if self._sampler is not None:
            self._sampler.start()

    def _new_outlet(self) -> Any:
        return start_outlet(self.config, self._coords)

    def _collect_steps(self) -> None:
        """Feeder thread: ended steps into the record queue (and steps the tracker dropped counted)."""
        tracker = self.tracker
        dropped = tracker.dropped
        for raw in tracker.collect():
            self._records.put(raw)
        if tracker.dropped != dropped:
            self._records.count_dropped(tracker.dropped - dropped)

    def _steps_waiting(self) -> int:
        return len(self.tracker.ended)

    def _kick_feeder(self) -> None:
        if self.feeder is not None:
            self.feeder.kick()

    def _on_gpu_uuid(self, gpu_uuid: str) -> None:
        if self.feeder is not None:
            self.feeder.set_gpu_uuid(gpu_uuid)

    def _on_span_overflow(self, step: int) -> None:
        self.once(
            "span_overflow",
            logging.WARNING,
            "smon: step %d has more than %d spans; further spans of that step are not recorded "
            "(do steps end? attach an optimizer or call mon.step())",
            step,
            MAX_SPANS_PER_STEP,
        )

    # -- public API -------------------------------------------------------------------------------
    def step(self, step: int | None = None) -> None:
        if self._closed:
            return
        try:
            if self.optimizer_driven:
                self.once(
                    "step_with_optimizer",
                    logging.INFO,
                    "smon: steps end at optimizer.step(); mon.step() is ignored "
                    "(use mon.set_step(n) to renumber)",
                )
                return
            self.tracker.end_step(number=step)
        except Exception as exc:
            self.errors.report("step", exc)

    def set_step(self, step: int) -> None:
        if self._closed:
            return
        try:
            self.tracker.set_step(int(step))
        except Exception as exc:
            self.errors.report("set_step", exc)

    def phase(self, name: str, microbatch: int | None = None, chunk: int = 0) -> AbstractContextManager[Any]:
        if self._closed:
            return _NULL_SCOPE
        return _PhaseScope(self, str(name), microbatch, chunk)

    def record_batch(self, seq_lens: Any, microbatch: int | None = None) -> None:
        if self._closed:
            return
        try:
            tracker = self.tracker
            if tracker.timed:  # (a step the device clock does not time is not recorded)
                tracker.add_seq(capture_explicit(seq_lens, tracker.device_event), microbatch, explicit=True)
        except Exception as exc:
            self.errors.report("record_batch", exc)

    def counters(self) -> dict[str, int]:
        feeder = self.feeder
        shipping = feeder.outlet.status() if feeder is not None else {}
        return {
            "dropped_records": self._records.dropped
            + self.tracker.uncollected_drops()
            + (feeder.lost if feeder else 0)
            + int(shipping.get("dropped", 0)),
            # Given up at exit after being sent on a stream that ended without a verdict: they
            # may have been stored, so they are not counted as dropped (smon/shipper.py).
            "unconfirmed_records": int(shipping.get("unconfirmed", 0)),
            "errors": self.errors.count + int(shipping.get("errors", 0)),
            "queued": len(self._records)
            + len(self.tracker.ended)
            + (feeder.pending if feeder else 0)
            + int(shipping.get("queued", 0)),
            "resent_batches": int(shipping.get("resent", 0)),
            "sent_batches": int(shipping.get("sent", 0)),
            "acked_batches": int(shipping.get("acked", 0)),
            "last_step": self.tracker.last_step,
        }

    def close(self, timeout: float | None = None) -> None:
        """Remove hooks, then flush for at most `timeout` (default `flush_timeout`) seconds."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.tracker.active = False
            self._gc.active = False
            self._gc.remove()
            for removable in self._removables:
                try:
                    removable.remove()
                except Exception as exc:
                    self.errors.report("remove_hooks", exc)
            if self._data_timer is not None:
                self._data_timer.restore()
            if self._sampler is not None:
                self._sampler.stop(timeout=0.5)
            if self.feeder is not None:
                self.feeder.close(self.config.flush_timeout if timeout is None else timeout)
        except Exception as exc:
            self.errors.report("close", exc)
        finally:
            _LIVE.discard(self)
            with contextlib.suppress(Exception):
                atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        self.close()

    def _disable_in_fork_child(self) -> None:
        """In a forked child (e.g. a DataLoader worker) the hooks must do nothing: no threads there."""
        self._closed = True
        self.tracker.active = False
        self._gc.active = False
        with contextlib.suppress(Exception):
            self._gc.remove()
        if self.feeder is not None:
            with contextlib.suppress(Exception):
                self.feeder.outlet.detach_in_fork_child()
