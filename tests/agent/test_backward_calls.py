"""Backward timed from `torch.autograd.backward` calls once a probe shows it equals the hooks' timing,
and kept on hooks wherever it would not (real CPU models, real autograd)."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pytest
import torch
from torch import nn

from smon import hooks as smon_hooks
from smon.backward_calls import PROBE_CALLS
from smon.cuda_timing import CudaClock
from smon.testing import FakeCuda
from tests.agent.conftest import op_spans
from tests.agent.torch_models import SlowDataset, mlp, train

BACKWARD_SLEEP = 0.03
FORWARD_SLEEP = 0.06  # also the foreign work's sleep: the slack of every upper bound
STEPS = 2 * PROBE_CALLS + 4  # the probe's steps (twice, if one was slowed), then steps timed by the calls
# Where the hooks must stay: each probe fails within 8 calls, and the fourth failure is for good.
KEEP_STEPS = 10


def backward_spans(step: Any) -> list[Any]:
    return [s for s in op_spans(step) if s.kind == "backward"]


def model_hooks(mon: Any) -> Any:
    (hooks,) = [r for r in mon._removables if hasattr(r, "backward_timing")]
    return hooks


def sorted_steps(ingest: Any) -> list[Any]:
    return sorted(ingest.servicer.steps(), key=lambda s: s.step)


def assert_backward_holds_its_sleep(span: Any) -> None:
    # At least the injected backward sleep, and not the forward's as well (the slack below that
    # bound absorbs a loaded machine's late wake-ups).
    assert BACKWARD_SLEEP <= span.duration < BACKWARD_SLEEP + FORWARD_SLEEP


def test_the_call_takes_over_in_a_plain_loop_and_times_what_the_hooks_timed(ingest, attach_fast):
    model = mlp(forward_sleep=FORWARD_SLEEP, backward_sleep=BACKWARD_SLEEP)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = (2 * PROBE_CALLS) // 3 + 4  # three calls a step
    loader = torch.utils.data.DataLoader(SlowDataset(n=2 * 3 * steps), batch_size=2)
    original = torch.autograd.backward
    mon = attach_fast(model, optimizer, loader, server=ingest.address)
    hooks = model_hooks(mon)
    assert torch.autograd.backward is not original and hooks.backward_timing == "probe"
    train(model, optimizer, loader, accumulate=3)
    assert hooks.backward_timing == "calls"
    # Once the call times backward, SMon's output hook is no longer set (it would have marked a start).
    hooked = hooks._backwards[0].start
    model(torch.randn(2, 16)).sum().backward()
    assert hooks._backwards[0].start is hooked
    optimizer.step()
    mon.close()
    assert torch.autograd.backward is original
    assert mon.counters()["errors"] == 0
    recorded = sorted_steps(ingest)
    assert [s.step for s in recorded] == list(range(steps + 1))
    for step in recorded[:steps]:  # the same spans before and after the switch
        assert [s.kind for s in op_spans(step)] == ["data_wait", "forward", "backward"] * 3 + ["optimizer"]
        assert [s.microbatch for s in backward_spans(step)] == [0, 1, 2]
        for span in backward_spans(step):
            assert_backward_holds_its_sleep(span)


def test_two_model_chunks_on_one_thread_each_time_the_same_call(ingest, attach_fast):
    """Two chunks of one stage (an interleaved schedule's virtual stages): one backward call runs
    both chunks' backwards, so once both have switched, the wrapper nests the two timers around
    the one call (`_within`). Their spans hold what the hooks held before: chunk 1's backward
    ends only with the graph, so each span holds chunk 0's sleep."""
    first = mlp(forward_sleep=FORWARD_SLEEP, backward_sleep=BACKWARD_SLEEP)
    second = nn.Sequential(nn.Linear(1, 1))  # its backward is short: chunk 0's hook fires soon
    optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.01)
    steps = 2 * PROBE_CALLS + 2
    loader = torch.utils.data.DataLoader(SlowDataset(n=2 * steps), batch_size=2)
    original = torch.autograd.backward
    mon = attach_fast([first, second], optimizer, loader, server=ingest.address)
    chunks = sorted((r for r in mon._removables if hasattr(r, "backward_timing")), key=lambda h: h.chunk)
    assert [h.chunk for h in chunks] == [0, 1]
    assert [h.backward_timing for h in chunks] == ["probe", "probe"]
    for x, y in loader:
        nn.functional.mse_loss(second(first(x)), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert [h.backward_timing for h in chunks] == ["calls", "calls"]
    mon.close()
    assert torch.autograd.backward is original
    assert mon.counters()["errors"] == 0
    recorded = sorted_steps(ingest)
    assert [s.step for s in recorded] == list(range(steps))
    for step in recorded:  # the same spans before the switch (hooks) and after it (nested timers)
        compute = [(s.kind, s.chunk) for s in op_spans(step) if s.kind in ("forward", "backward")]
        assert compute[:2] == [("forward", 0), ("forward", 1)]
        assert sorted(compute[2:]) == [("backward", 0), ("backward", 1)]
        by_chunk = {s.chunk: s for s in backward_spans(step)}
        assert all(s.microbatch == 0 for s in by_chunk.values())
        for span in by_chunk.values():
            assert_backward_holds_its_sleep(span)
    # The last step's call ran in both timers, chunk 1's around chunk 0's: its span holds the
    # other's whole (under hooks chunk 1's ended first, with the graph).
    outer, inner = (by_chunk[c] for c in (1, 0))
    assert outer.start <= inner.start
    assert inner.start + inner.duration <= outer.start + outer.duration


def test_reentrant_checkpointing_nests_backward_calls_and_the_call_still_takes_over(ingest, attach_fast):
    """Reentrant activation checkpointing calls torch.autograd.backward inside backward: only the
    outer call is the micro-batch's backward."""
    inner = mlp(forward_sleep=FORWARD_SLEEP, backward_sleep=BACKWARD_SLEEP)

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=True)

    model = Checkpointed()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    for _ in range(STEPS):
        model(torch.randn(2, 16, requires_grad=True)).sum().backward()
        optimizer.step()
    hooks = model_hooks(mon)
    mon.close()
    assert hooks.backward_timing == "calls"
    for step in sorted_steps(ingest):
        assert [s.kind for s in op_spans(step)] == ["forward", "backward", "optimizer"]
        (backward,) = backward_spans(step)
        # the recomputed forward runs inside backward: its sleep is backward time here
        assert BACKWARD_SLEEP + FORWARD_SLEEP <= backward.duration < BACKWARD_SLEEP + 2 * FORWARD_SLEEP


def run_engine_directly(loss: torch.Tensor) -> None:
    """What Megatron's pipeline schedules do: enter the engine without torch.autograd.backward."""
    torch.autograd.Variable._execution_engine.run_backward(
        (loss,), (torch.ones_like(loss),), False, False, (), True, True
    )


class _QueueSlowCallback(torch.autograd.Function):
    """Identity whose backward queues a final callback that sleeps, as FSDP's post-backward does
    (which waits for the last reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: time.sleep(FORWARD_SLEEP))
        return grad


class QueueSlowCallback(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _QueueSlowCallback.apply(x)


def with_slow_callback() -> nn.Module:
    """The callback is queued late in backward, after SMon's own end callback (queued at its start)."""
    return nn.Sequential(
        nn.Linear(16, 16),
        QueueSlowCallback(),
        mlp(forward_sleep=FORWARD_SLEEP, backward_sleep=BACKWARD_SLEEP),
    )


def stray_backward(model: nn.Module, x: torch.Tensor) -> None:
    """After the model's forward, the backward of another graph first (a GAN's discriminator)."""
    other = nn.Linear(16, 1)
    out = model(x)
    other(x).sum().backward()
    out.sum().backward()


def two_microbatches_in_one_call(model: nn.Module, x: torch.Tensor) -> None:
    (model(x).sum() + model(x).sum()).backward()


def plain(model: nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def plain_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = STEPS) -> None:
    """`steps` plain training steps of a 2x16 batch: enough for the probe to decide."""
    for _ in range(steps):
        plain(model, torch.randn(2, 16))
        optimizer.step()


def sleepy() -> nn.Module:
    return mlp(backward_sleep=BACKWARD_SLEEP)


@pytest.mark.parametrize(
    ("make_model", "train_step", "backwards_per_step"),
    [
        (sleepy, "engine", 1),
        (with_slow_callback, "plain", 1),
        (sleepy, "stray", 1),
        (sleepy, "two", 2),  # both outputs' hooks fire at once: each span holds both sleeps
    ],
    ids=["engine-entered-directly", "foreign-final-callback", "stray-backward", "two-microbatches-one-call"],
)
def test_hooks_keep_timing_backward_where_the_call_would_not_be_exact(
    ingest, attach_fast, make_model, train_step, backwards_per_step
):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    original = torch.autograd.backward
    mon = attach_fast(model, optimizer, server=ingest.address)
    hooks = model_hooks(mon)
    for _ in range(KEEP_STEPS):
        x = torch.randn(2, 16)
        if train_step == "engine":
            run_engine_directly(model(x).sum())
        elif train_step == "stray":
            stray_backward(model, x)
        elif train_step == "two":
            two_microbatches_in_one_call(model, x)
        else:
            plain(model, x)
        optimizer.step()
        optimizer.zero_grad()
    assert hooks.backward_timing == "hooks"
    assert torch.autograd.backward is original  # given up: the wrapper is gone
    mon.close()
    assert mon.counters()["errors"] == 0
    steps = sorted_steps(ingest)
    assert len(steps) == KEEP_STEPS
    durations = []
    for step in steps:
        spans = backward_spans(step)
        assert sorted(s.microbatch for s in spans) == list(range(backwards_per_step))
        for span in spans:
            assert span.duration >= BACKWARD_SLEEP
            durations.append(span.duration)
    # the hooks' backward, not the stray graph's or the slow final callback: those would add at
    # least FORWARD_SLEEP to every span; the median, since one preempted step can too
    assert statistics.median(durations) < backwards_per_step * BACKWARD_SLEEP + FORWARD_SLEEP


def test_a_backward_that_raises_is_raised_unchanged_and_leaves_no_span(ingest, attach_fast):
    model = mlp(backward_sleep=BACKWARD_SLEEP)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    hooks = model_hooks(mon)
    for step in range(STEPS + 1):
        out = model(torch.randn(2, 16)).sum()
        if step == STEPS:
            assert hooks.backward_timing == "calls"
            out.backward()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                out.backward()  # the graph is freed: torch's own error, as without SMon
        else:
            out.backward()
        optimizer.step()
    mon.close()
    assert mon.counters()["errors"] == 0
    last = sorted_steps(ingest)[-1]
    assert [s.kind for s in op_spans(last)] == ["forward", "backward", "optimizer"]


def test_other_threads_and_later_wrappers_are_left_alone(ingest, attach_fast):
    model = mlp(backward_sleep=BACKWARD_SLEEP)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    ours = torch.autograd.backward
    seen: list[str] = []

    def user_wrapper(*args: Any, **kwargs: Any) -> Any:  # e.g. a framework patching it too
        seen.append("user")
        return ours(*args, **kwargs)

    torch.autograd.backward = user_wrapper
    try:
        plain_steps(model, optimizer)
        # Between a forward and its backward, another thread runs a backward of another graph:
        # not this model's (were it taken for one, the model's own backward would go unrecorded).
        out = model(torch.randn(2, 16)).sum()
        other = nn.Linear(16, 1)
        thread = threading.Thread(target=lambda: other(torch.randn(2, 16)).sum().backward())
        thread.start()
        thread.join()
        out.backward()
        optimizer.step()
        assert model_hooks(mon).backward_timing == "calls"
        mon.close()
        assert torch.autograd.backward is user_wrapper  # not unwrapped from under the user
        plain(model, torch.randn(2, 16))  # ours passes the call through
        assert seen == ["user"] * (STEPS + 3)
    finally:
        torch.autograd.backward = ours.__wrapped__  # type: ignore[attr-defined]
    steps = sorted_steps(ingest)
    assert len(steps) == STEPS + 1
    for step in steps:
        assert [s.kind for s in op_spans(step)] == ["forward", "backward", "optimizer"]
        (backward,) = backward_spans(step)
        assert backward.duration >= BACKWARD_SLEEP


class Discriminator(nn.Module):
    """A loss network outside the attached model (a GAN's discriminator, a perceptual loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(backward_sleep=FORWARD_SLEEP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_long_backward_before_the_models_own_keeps_the_hooks(ingest, attach_fast):
    """`D(G(z)).backward()` runs D's backward before G's: under the call it would land in G's."""
    generator = mlp(backward_sleep=BACKWARD_SLEEP)
    discriminator = Discriminator()
    optimizer = torch.optim.SGD(generator.parameters(), lr=0.01)
    mon = attach_fast(generator, optimizer, server=ingest.address)
    for _ in range(KEEP_STEPS):
        discriminator(generator(torch.randn(2, 16)).repeat(1, 16)).sum().backward()
        optimizer.step()
    assert model_hooks(mon).backward_timing == "hooks"
    mon.close()
    for step in sorted_steps(ingest):
        (backward,) = backward_spans(step)
        assert BACKWARD_SLEEP <= backward.duration < BACKWARD_SLEEP + FORWARD_SLEEP  # G's, not D's too


class SyncOnLast(nn.Module):
    """Queues a slow final callback in the backward of the last micro-batch of a step only, as
    FSDP2 does when it reduces on the last micro-batch of gradient accumulation."""

    def __init__(self) -> None:
        super().__init__()
        self.sync = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _QueueSlowCallback.apply(x) if self.sync else x


def test_a_slow_final_callback_on_one_microbatch_in_four_keeps_the_hooks(ingest, attach_fast):
    sync = SyncOnLast()
    model = nn.Sequential(nn.Linear(16, 16), sync, mlp(backward_sleep=BACKWARD_SLEEP))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    for _ in range(KEEP_STEPS):
        for microbatch in range(4):
            sync.sync = microbatch == 3
            model(torch.randn(2, 16)).sum().backward()
        optimizer.step()
    assert model_hooks(mon).backward_timing == "hooks"
    mon.close()
    for step in sorted_steps(ingest):
        spans = backward_spans(step)
        assert [s.microbatch for s in spans] == [0, 1, 2, 3]
        assert all(BACKWARD_SLEEP <= s.duration < BACKWARD_SLEEP + FORWARD_SLEEP for s in spans)


def test_all_forwards_before_all_backwards_records_each_backward_once(ingest, attach_fast):
    """GPipe order: forwards hooked before the switch still carry the output hook; the call that
    took over times their backward, the hook must not record it again."""
    model = mlp(backward_sleep=BACKWARD_SLEEP)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    for _ in range((2 * PROBE_CALLS) // 3 + 4):
        losses = [model(torch.randn(2, 16)).sum() for _ in range(3)]  # 3 does not divide the probe's 8
        for loss in losses:
            loss.backward()
        optimizer.step()
    assert model_hooks(mon).backward_timing == "calls"
    mon.close()
    assert mon.counters()["errors"] == 0
    for step in sorted_steps(ingest):
        spans = backward_spans(step)
        assert [s.microbatch for s in spans] == [0, 1, 2]
        assert all(s.duration >= BACKWARD_SLEEP for s in spans)


def test_a_loop_that_changes_after_the_switch_goes_back_to_hooks(ingest, attach_fast, monkeypatch):
    """Re-probes every RECHECK_EVERY forwards: a stable loop stays on the call; a library that
    restores the original torch.autograd.backward (dropping SMon's wrapper) sends it back to hooks."""
    monkeypatch.setattr(smon_hooks, "RECHECK_EVERY", 5)
    rechecks: list[int] = []
    recheck = smon_hooks.ModelHooks._recheck

    def counted(self: Any) -> None:
        rechecks.append(1)
        recheck(self)

    monkeypatch.setattr(smon_hooks.ModelHooks, "_recheck", counted)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    original = torch.autograd.backward
    mon = attach_fast(model, optimizer, server=ingest.address)
    hooks = model_hooks(mon)
    seen: set[str] = set()
    first = STEPS + 20  # steps before the wrapper is dropped: the probe, then at least 4 re-probes
    for _ in range(first):
        plain(model, torch.randn(2, 16))
        optimizer.step()
        seen.add(hooks.backward_timing)
    # A re-probe is over within its step; one slowed by a preempted thread starts a whole probe.
    assert len(rechecks) >= 3 and "calls" in seen and hooks.backward_timing in ("calls", "probe")
    assert torch.autograd.backward is not original
    torch.autograd.backward = original  # e.g. a framework that saved the original before attach
    for _ in range(10):
        plain(model, torch.randn(2, 16))
        optimizer.step()
    assert hooks.backward_timing == "hooks"
    mon.close()
    assert mon.counters()["errors"] == 0
    steps = sorted_steps(ingest)
    assert len(steps) == first + 10
    missing = [s.step for s in steps if len(backward_spans(s)) != 1]
    # Only steps between dropping the wrapper and the next re-probe may lack their backward.
    assert all(first <= n < first + 5 for n in missing)
    assert backward_spans(steps[-1])


class RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise ValueError("user backward failed")


def test_a_backward_that_raises_under_the_call_leaves_no_open_phase(ingest, attach_fast):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    plain_steps(model, optimizer)
    assert model_hooks(mon).backward_timing == "calls"
    out = RaiseInBackward.apply(model(torch.randn(2, 16))).sum()
    with pytest.raises(ValueError, match="user backward failed"):
        out.backward()
    assert not [kind for kind, _ in mon.tracker._open if kind == "backward"]
    optimizer.step()
    plain(model, torch.randn(2, 16))
    optimizer.step()
    mon.close()
    assert mon.counters()["errors"] == 0
    steps = sorted_steps(ingest)
    assert backward_spans(steps[STEPS]) == []  # the failed backward: no span
    assert len(backward_spans(steps[STEPS + 1])) == 1


def test_device_clocks_never_probe(ingest, attach_fast):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address, timing=CudaClock(FakeCuda()))
    plain_steps(model, optimizer)
    assert model_hooks(mon).backward_timing == "hooks"


def test_a_failing_tracker_under_the_call_is_counted_and_never_raised(ingest, attach_fast, monkeypatch):
    """Once the call times backward, the wrapper runs it in the tracker's timer: the timer's own
    errors, before or after the call, are caught there and counted once per kind, and the
    backward itself runs exactly once, as usual."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    plain_steps(model, optimizer)
    hooks = model_hooks(mon)
    assert hooks.backward_timing == "calls"

    class RefusingDict(dict):  # the timer's pairing, before the call
        def get(self, *args: Any) -> Any:
            raise RuntimeError("smon bug")

    class RefusingList(list):  # the timer's span, after the call
        def append(self, item: Any) -> None:
            raise RuntimeError("smon bug")

    graph_runs: list[int] = []
    for name, broken in (("_backwards", RefusingDict()), ("_spans", RefusingList())):
        loss = model(torch.randn(2, 16)).sum()
        graph_runs.clear()
        grad_fn = loss.grad_fn
        assert grad_fn is not None
        grad_fn.register_hook(lambda *args: graph_runs.append(1))  # the graph runs once, not twice
        before = [p.detach().clone() for p in model.parameters()]
        with monkeypatch.context() as patched:
            patched.setattr(mon.tracker, name, broken)
            loss.backward()  # no exception reaches the loop
        assert graph_runs == [1]
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        optimizer.step()
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    errors = mon.counters()["errors"]
    assert errors == 2
    plain(model, torch.randn(2, 16))  # the real state again: nothing more counted
    optimizer.step()
    mon.close()
    assert mon.counters()["errors"] == errors
