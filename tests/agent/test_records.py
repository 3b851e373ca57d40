"""RawStep -> StepRecord arithmetic and the step tracker's bounds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from smon.records import covered_seconds, to_step_record
from smon.steps import RawStep, StepTracker
from smon.timing import HostClock


def test_covered_seconds_is_the_union_clipped_to_the_step():
    assert covered_seconds([], 0, 1) == 0
    assert covered_seconds([(0.1, 0.3), (0.2, 0.4), (0.5, 0.6)], 0, 1) == pytest.approx(0.4)
    assert covered_seconds([(-1.0, 0.2), (0.9, 2.0)], 0, 1) == pytest.approx(0.3)
    assert covered_seconds([(0.1, 0.9), (0.2, 0.3)], 0, 1) == pytest.approx(0.8)


def raw_step(spans, gc_pauses=(), start=100.0, end=101.0) -> RawStep:
    return RawStep(
        step=4,
        clock=HostClock(),
        wall_anchor=1_700_000_000.0,
        start=start,
        end=end,
        spans=list(spans),
        gc_pauses=list(gc_pauses),
    )


def test_step_record_fields():
    record = to_step_record(
        raw_step(
            [
                ("forward", 100.1, 100.4, 0, 0),
                ("backward", 100.4, 100.8, 0, 0),
                ("custom", 100.2, 100.3, None, 1),
            ],
            gc_pauses=[(100.5, 0.05), (100.6, 0.0001)],
        )
    )
    assert record is not None
    assert (record.step, record.duration) == (4, pytest.approx(1.0))
    assert record.start_time == pytest.approx(1_700_000_100.0)
    assert record.end_time == pytest.approx(1_700_000_101.0)
    assert [s.kind for s in record.spans] == ["forward", "custom", "backward", "gc"]  # by start
    assert record.spans[1].chunk == 1 and not record.spans[1].HasField("microbatch")
    assert (record.gc_count, record.gc_seconds) == (2, pytest.approx(0.0501))
    assert record.phases["gc"] == pytest.approx(0.0501)  # all pauses, short ones too
    assert len([s for s in record.spans if s.kind == "gc"]) == 1  # only >= 1 ms becomes a span
    assert record.phases["other"] == pytest.approx(1.0 - 0.7)  # custom and gc sit inside others


def test_step_without_any_activity_starts_at_attach():
    tracker = StepTracker(HostClock(), start_step=3)
    tracker.end_step()
    tracker.end_step()
    raws = tracker.collect()
    assert [r.step for r in raws] == [3, 4] and raws[1].start is raws[0].end
    beat = tracker.heartbeat()
    assert (beat.last_step, beat.current_step, beat.phase) == (4, 5, "")


def test_a_step_that_never_ends_keeps_memory_bounded(caplog):
    from smon.steps import MAX_SPANS_PER_STEP

    said: list[int] = []
    tracker = StepTracker(HostClock(), on_overflow=said.append)
    for _ in range(MAX_SPANS_PER_STEP + 100):
        tracker.close("custom", tracker.open("custom"))
    tracker.end_step()
    raws = tracker.collect()
    assert len(raws[0].spans) == MAX_SPANS_PER_STEP and said == [0]


class _Owner:
    """A `ForwardOwner` that notes each `after_forward`."""

    def __init__(self, module: object, every: int) -> None:
        self.module = module
        self.forwards_until_after = every
        self.after: list[tuple[int, object]] = []

    def after_forward(self, microbatch: int, output: object) -> None:
        self.after.append((microbatch, output))


def test_the_fused_forward_backward_and_optimizer_paths_keep_the_cap_and_the_open_phases():
    """timed_forward / timed_backward / the optimizer's hooks do open and close's work inline: the
    phase shows while the call runs, the call's result and exceptions pass through untouched."""
    from smon.steps import MAX_SPANS_PER_STEP

    said: list[int] = []
    errors: list[str] = []
    tracker = StepTracker(HostClock(), on_overflow=said.append)
    module = SimpleNamespace(training=True)
    owner = _Owner(module, every=2)
    backward = tracker.timed_backward(0, lambda kind, exc: errors.append(kind))
    pre, post = tracker.optimizer_step_hooks(lambda kind, exc: errors.append(kind))
    seen: list[str] = []

    def model(module: object, x: int, scale: int = 1) -> int:
        seen.append(tracker.heartbeat().phase)
        return x * scale

    def grads(*args: object, **kwargs: object) -> tuple[object, ...]:
        seen.append(tracker.heartbeat().phase)
        return args, kwargs

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("the user's own error")

    def timed(forward: Any) -> Any:
        return tracker.timed_forward(0, owner, forward, lambda: True, lambda kind, exc: errors.append(kind))

    forward = timed(model)
    assert forward(module, 3, scale=2) == 6
    module.training = False
    assert forward(module, 1) == 1  # eval: no micro-batch, no after_forward
    module.training = True
    assert forward(SimpleNamespace(training=True), 7) == 7  # another instance: not timed
    assert backward(grads, (1,), {"retain_graph": True}) == ((1,), {"retain_graph": True})
    assert backward(grads, (), {}) == ((), {})  # one forward, one backward: the second untimed
    assert forward(module, 5) == 5
    with pytest.raises(ValueError, match="own error"):
        backward(broken, (), {})  # raised through, no span
    with pytest.raises(ValueError, match="own error"):
        timed(broken)(module)  # raised through, no span (its micro-batch is counted)
    assert seen == ["forward", "eval", "", "backward", "", "forward"] and tracker.heartbeat().phase == ""
    assert owner.after == [(1, 5)] and errors == []  # after_forward once the count ran down
    pre(None, (), {})
    inner = tracker.open("custom")  # still open when the step ends: it is discarded, not leaked
    post(None, (), {})
    assert tracker.heartbeat().phase == "custom"
    tracker.discard(inner)
    (raw,) = tracker.collect()
    assert [(k, mb) for k, _, _, mb, _ in raw.spans] == [
        ("forward", 0),
        ("eval", None),
        ("backward", 0),
        ("forward", 1),
        ("optimizer", None),
    ]
    assert all(start <= end for _, start, end, _, _ in raw.spans)
    assert raw.end == raw.spans[-1][2] and tracker.heartbeat().phase == ""

    for _ in range(MAX_SPANS_PER_STEP + 10):
        forward(module, 1)
        backward(grads, (), {})
    pre(None, (), {})
    post(None, (), {})
    (raw,) = tracker.collect()
    assert len(raw.spans) == MAX_SPANS_PER_STEP and said == [1]
    assert tracker.heartbeat().phase == ""  # every phase opened past the cap was closed too
    assert errors == []


def test_close_and_open_hands_backward_over_to_grad_sync_at_one_mark_and_keeps_the_cap():
    """DDP's backward-end callback closes backward and opens grad_sync in one call."""
    from smon.steps import MAX_SPANS_PER_STEP

    said: list[int] = []
    tracker = StepTracker(HostClock(), on_overflow=said.append)
    outer = tracker.open("custom")
    began = tracker.open("backward")
    sync = tracker.close_and_open("backward", began, 3, 1, "grad_sync")
    assert tracker.heartbeat().phase == "grad_sync"
    tracker.close("grad_sync", sync, None, 1)
    assert tracker.heartbeat().phase == "custom"  # the enclosing phase stays open
    tracker.close("custom", outer)
    tracker.end_step()
    (raw,) = tracker.collect()
    spans = {k: (s, e, mb, chunk) for k, s, e, mb, chunk in raw.spans}
    assert spans["backward"][1] == spans["grad_sync"][0] == sync  # no gap, no overlap
    assert spans["backward"][2:] == (3, 1) and spans["grad_sync"][2:] == (None, 1)

    for _ in range(MAX_SPANS_PER_STEP):
        tracker.close("custom", tracker.open("custom"))
    began = tracker.open("backward")
    sync = tracker.close_and_open("backward", began, 0, 0, "grad_sync")
    assert tracker.heartbeat().phase == "grad_sync" and said == [1]  # past the cap: said once
    tracker.close("grad_sync", sync)
    tracker.end_step()
    (raw,) = tracker.collect()
    assert len(raw.spans) == MAX_SPANS_PER_STEP and tracker.heartbeat().phase == ""


def test_the_data_loader_and_optimizer_hook_bodies_keep_the_cap_and_the_open_phases():
    """timed_next and optimizer_step_hooks do open and close's work inline."""
    from smon.steps import MAX_SPANS_PER_STEP

    said: list[int] = []
    errors: list[str] = []
    tracker = StepTracker(HostClock(), on_overflow=said.append)
    phases_seen: list[str] = []

    def fetch(iterator: list[int]) -> int:
        phases_seen.append(tracker.heartbeat().phase)
        if not iterator:
            raise StopIteration
        return iterator.pop()

    timed = tracker.timed_next(fetch, lambda kind, exc: errors.append(kind))
    pre, post = tracker.optimizer_step_hooks(lambda kind, exc: errors.append(kind))
    assert timed([7]) == 7
    with pytest.raises(StopIteration):
        timed([])  # the end of an epoch: no batch waited for, no span, nothing left open
    assert phases_seen == ["data_wait", "data_wait"] and tracker.heartbeat().phase == ""
    pre(None, (), {})
    assert tracker.heartbeat().phase == "optimizer"
    post(None, (), {})
    post(None, (), {})  # a step end without a pre hook (its own step, no optimizer span)
    first, second = tracker.collect()
    assert [k for k, *_ in first.spans] == ["data_wait", "optimizer"] and second.spans == []
    assert first.end == first.spans[-1][2] and tracker.heartbeat().phase == ""

    for _ in range(MAX_SPANS_PER_STEP + 3):
        timed([1])
    pre(None, (), {})
    post(None, (), {})
    (raw,) = tracker.collect()
    assert len(raw.spans) == MAX_SPANS_PER_STEP and said == [2] and errors == []
    assert tracker.heartbeat().phase == ""  # every phase opened past the cap was closed too

    tracker.active = False  # closed monitor: plain pass-through, nothing recorded
    assert timed([5]) == 5
    pre(None, (), {})
    post(None, (), {})
    assert tracker.collect() == []


def test_collect_places_gc_pauses_in_their_steps_and_counts_dropped_steps():
    drained = [[(5.0, 0.1), (15.0, 0.2), (25.0, 0.3)]]
    tracker = StepTracker(HostClock(), gc_drain=lambda: drained.pop() if drained else [])
    tracker.end_step(end=10.0)
    tracker.end_step(end=20.0)
    raws = tracker.collect()
    assert [r.gc_pauses for r in raws] == [[(5.0, 0.1)], [(15.0, 0.2)]]
    tracker.end_step(end=30.0)  # the pause after step 1 waited for the step it happened in
    (raw,) = tracker.collect()
    assert raw.gc_pauses == [(25.0, 0.3)] and raw.start == 20.0 and raw.ended_at == 30.0

    small = StepTracker(HostClock(), capacity=2)
    for _ in range(5):
        small.end_step()
    assert [r.step for r in small.collect()] == [3, 4] and small.dropped == 3


def test_sequence_samples_stay_in_the_step_they_were_recorded_in():
    """A step without samples must not hand over the list the next step appends to."""
    tracker = StepTracker(HostClock())
    tracker.end_step()  # step 0: no samples
    tracker.add_seq([5, 6], 0, explicit=True)
    tracker.end_step()  # step 1: one
    tracker.end_step()  # step 2: none
    raws = tracker.collect()  # all three collected together, as a feeder behind the loop does
    assert [len(r.seq) for r in raws] == [0, 1, 0]
    records = [to_step_record(r) for r in raws]
    assert [r.seq.count if r is not None else None for r in records] == [0, 2, 0]
