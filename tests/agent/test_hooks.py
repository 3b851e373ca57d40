"""Hooks on a real torch model, optimizer and data loader (CPU): spans, steps, micro-batches."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from smon.records import covered_seconds
from smon.v1 import ingest_pb2 as pb
from tests.agent.conftest import op_spans
from tests.agent.torch_models import SlowDataset, mlp, train

FORWARD_SLEEP = 0.05
BACKWARD_SLEEP = 0.08
SAMPLE_SLEEP = 0.005


def spans(step: pb.StepRecord, kind: str) -> list[pb.Span]:
    return [s for s in step.spans if s.kind == kind]


def kinds(step: pb.StepRecord) -> list[str]:
    return [s.kind for s in op_spans(step)]


def run(attach_fast, ingest, *, steps_expected: int, accumulate: int = 1, **model_kw) -> list[pb.StepRecord]:
    model = mlp(**model_kw)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        SlowDataset(n=2 * steps_expected * accumulate, seconds=SAMPLE_SLEEP), batch_size=2
    )
    mon = attach_fast(model, optimizer, loader, server=ingest.address)
    train(model, optimizer, loader, accumulate=accumulate)
    mon.close()
    assert mon.counters()["errors"] == 0
    steps = sorted(ingest.servicer.steps(), key=lambda s: s.step)
    assert [s.step for s in steps] == list(range(steps_expected))
    return steps


def test_phase_spans_match_injected_costs(ingest, attach_fast):
    steps = run(
        attach_fast, ingest, steps_expected=3, forward_sleep=FORWARD_SLEEP, backward_sleep=BACKWARD_SLEEP
    )
    for step in steps:
        assert kinds(step) == ["data_wait", "forward", "backward", "optimizer"]
        (data,), (fwd,), (bwd,), (opt,) = (
            spans(step, k) for k in ("data_wait", "forward", "backward", "optimizer")
        )
        assert data.duration >= 2 * SAMPLE_SLEEP
        # Neither holds the other's sleep (the bound is what that mistake would add; the slack
        # below it absorbs a loaded machine's late wake-ups).
        assert FORWARD_SLEEP <= fwd.duration < FORWARD_SLEEP + BACKWARD_SLEEP
        assert BACKWARD_SLEEP <= bwd.duration < BACKWARD_SLEEP + FORWARD_SLEEP
        assert opt.duration < FORWARD_SLEEP  # neither sleep is in the optimizer span (0.05 s, 0.08 s)
        assert fwd.microbatch == 0 and bwd.microbatch == 0 and not data.HasField("microbatch")
        # spans are ordered, inside the step and do not overlap here
        assert step.start_time <= data.start and opt.start + opt.duration <= step.end_time + 1e-6
        for a, b in itertools.pairwise(op_spans(step)):
            assert a.start + a.duration <= b.start + 1e-6
        assert step.end_time - step.start_time == pytest.approx(step.duration, abs=1e-6)
        for kind in ("data_wait", "forward", "backward", "optimizer"):
            assert step.phases[kind] == pytest.approx(spans(step, kind)[0].duration)
        covered = covered_seconds(
            [(s.start, s.start + s.duration) for s in step.spans], step.start_time, step.end_time
        )
        assert step.phases["other"] == pytest.approx(step.duration - covered, abs=1e-6)
    for earlier, later in itertools.pairwise(steps):  # a step starts where the last one ended
        assert later.start_time == pytest.approx(earlier.end_time, abs=1e-6)


def test_each_forward_is_a_microbatch(ingest, attach_fast):
    steps = run(attach_fast, ingest, steps_expected=2, accumulate=3)
    for step in steps:
        assert [s.microbatch for s in spans(step, "forward")] == [0, 1, 2]
        assert [s.microbatch for s in spans(step, "backward")] == [0, 1, 2]
        assert len(spans(step, "data_wait")) == 3


def test_eval_forwards_are_not_training_microbatches(ingest, attach_fast):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    x = torch.randn(4, 16)
    model(x).sum().backward()
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()
    optimizer.step()
    mon.close()
    (step,) = ingest.servicer.steps()
    assert [(s.kind, s.microbatch if s.HasField("microbatch") else None) for s in op_spans(step)] == [
        ("forward", 0),
        ("backward", 0),
        ("eval", None),
        ("optimizer", None),
    ]


def test_training_results_unchanged_by_the_agent(ingest, attach_fast):
    def losses(with_agent: bool) -> tuple[list[float], list[torch.Tensor]]:
        model = mlp()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(SlowDataset(n=24), batch_size=4)
        mon = attach_fast(model, optimizer, loader, server=ingest.address) if with_agent else None
        result = train(model, optimizer, loader)
        if mon is not None:
            mon.close()
        return result, [p.detach().clone() for p in model.parameters()]

    plain_losses, plain_params = losses(False)
    agent_losses, agent_params = losses(True)
    assert agent_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(plain_params, agent_params, strict=True))


def test_manual_steps_numbering_and_resync(ingest, attach_fast):
    mon = attach_fast(server=ingest.address, start_step=10)
    mon.step()  # 10
    mon.step(step=100)  # the step that ends here is 100
    mon.step()  # 101
    mon.set_step(500)
    mon.step()  # 500
    mon.close()
    assert ingest.servicer.step_numbers() == [10, 100, 101, 500]


def test_mon_step_is_ignored_when_the_optimizer_ends_steps(ingest, attach_fast, caplog):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    with caplog.at_level(logging.INFO, logger="smon"):
        for _ in range(3):
            model(torch.randn(2, 16)).sum().backward()
            optimizer.step()
            mon.step()
    mon.close()
    assert ingest.servicer.step_numbers() == [0, 1, 2]
    assert len([r for r in caplog.records if "mon.step() is ignored" in r.getMessage()]) == 1


def test_user_phases_nest_and_record_microbatch_and_chunk(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    with mon.phase("checkpoint"), mon.phase("forward_send", microbatch=3, chunk=1):
        pass
    with pytest.raises(ValueError), mon.phase("h2d"):
        raise ValueError("the user's error propagates")
    mon.step()
    mon.close()
    (step,) = ingest.servicer.steps()
    by_kind = {s.kind: s for s in op_spans(step)}
    assert set(by_kind) == {"checkpoint", "forward_send", "h2d"}
    assert by_kind["forward_send"].microbatch == 3 and by_kind["forward_send"].chunk == 1
    assert not by_kind["checkpoint"].HasField("microbatch")
    if step.gc_count == 0:  # nested spans count once in "other": other = duration - union(spans)
        union = by_kind["checkpoint"].duration + by_kind["h2d"].duration
        assert step.phases["other"] == pytest.approx(step.duration - union, abs=1e-6)


def test_close_removes_every_hook(ingest, attach_fast):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(n=8), batch_size=4)
    original_class = type(loader)
    mon = attach_fast(model, optimizer, loader, server=ingest.address)
    assert type(model) is not torch.nn.Sequential and type(loader) is not original_class
    assert not model._forward_hooks and not model._forward_pre_hooks  # forward is timed by its class
    mon.close()
    assert type(model) is torch.nn.Sequential
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert type(loader) is original_class
    train(model, optimizer, loader)  # still trains, records nothing more
    mon.close()


def test_hook_failures_are_counted_and_logged_once_never_raised(ingest, attach_fast, caplog, monkeypatch):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(n=16), batch_size=4)
    mon = attach_fast(model, optimizer, loader, server=ingest.address)

    class Refusing(list):  # every hook opens a phase: each of them now meets an SMon bug
        def append(self, item: object) -> None:
            raise RuntimeError("smon bug")

    monkeypatch.setattr(mon.tracker, "_open", Refusing())
    with caplog.at_level(logging.WARNING, logger="smon"):
        losses = train(model, optimizer, loader)
        with mon.phase("custom"):
            pass
    assert len(losses) == 4
    assert mon.counters()["errors"] >= 4 * 3
    kinds = {r.getMessage().split(" failed")[0] for r in caplog.records if "smon bug" in r.getMessage()}
    assert {"smon: data_wait", "smon: forward_pre_hook", "smon: optimizer_pre_hook", "smon: phase"} <= kinds
    assert len([r for r in caplog.records if "smon bug" in r.getMessage()]) == len(kinds)
    mon.close()
    assert ingest.servicer.step_numbers() == [0, 1, 2, 3]  # step boundaries still recorded


def test_the_step_end_hook_counts_its_errors_and_the_public_step_end_raises_them(
    ingest, attach_fast, monkeypatch
):
    """The optimizer's post hook is the tracker's `end_step` itself: called by torch it counts an
    error and `optimizer.step()` goes on; called by SMon's own code it raises, for that caller
    to count."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)

    class Refusing(list):
        def append(self, item: object) -> None:
            raise RuntimeError("smon bug")

    monkeypatch.setattr(mon.tracker, "ended", Refusing())
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()  # the post hook fails inside: not raised
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert mon.counters()["errors"] == 1
    with pytest.raises(RuntimeError, match="smon bug"):
        mon.tracker.end_step()
    monkeypatch.undo()
    mon.close()
    assert mon.counters()["errors"] == 1


def test_user_gradient_hooks_on_the_output_still_run(ingest, attach_fast):
    """SMon's backward-start hook is reused every step but never lands in the output's own hook
    dict: a user's hook runs for its own tensor only, and can be removed."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    seen: list[tuple[str, int]] = []
    for step in range(4):
        out = model(torch.randn(step + 1, 16))
        if step == 0:  # kept: must not run for later steps' outputs
            out.register_hook(lambda grad: seen.append(("kept", grad.shape[0])))
        if step == 2:
            handle = out.register_hook(lambda grad: seen.append(("removed", grad.shape[0])))
            handle.remove()
        if step == 3:
            out.register_hook(lambda grad: seen.append(("last", grad.shape[0])))
        out.sum().backward()
        optimizer.step()
    mon.close()
    assert seen == [("kept", 1), ("last", 4)]
    assert mon.counters()["errors"] == 0
    steps = sorted(ingest.servicer.steps(), key=lambda s: s.step)
    assert [kinds(s) for s in steps] == [["forward", "backward", "optimizer"]] * 4
