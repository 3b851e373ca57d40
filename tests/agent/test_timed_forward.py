"""Forward timed by swapping the root module instance's class: the module stays the user's module."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import weakref

import pytest
import torch
from torch import nn

from tests.agent.conftest import op_spans
from tests.agent.torch_models import mlp


def kinds_per_step(ingest) -> list[list[str]]:
    steps = sorted(ingest.servicer.steps(), key=lambda s: s.step)
    return [[s.kind for s in op_spans(step)] for step in steps]


def one_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()


class Scaled(nn.Module):
    """A user module with its own attributes, buffers and a keyword argument in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = mlp()
        self.register_buffer("scale", torch.tensor(2.0))
        self.note = "kept"

    def forward(self, x: torch.Tensor, *, factor: float = 1.0) -> torch.Tensor:
        """The user's docstring."""
        return self.inner(x) * self.scale * factor


def test_the_timed_module_is_the_same_module(ingest, attach_fast):
    model = Scaled()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    text = repr(model)
    mon = attach_fast(model, server=ingest.address)
    assert type(model) is not Scaled and isinstance(model, Scaled) and isinstance(model, nn.Module)
    assert type(model).__name__ == "Scaled" and type(model).__qualname__ == Scaled.__qualname__
    assert repr(model) == text and model.note == "kept" and model.forward.__doc__ == "The user's docstring."
    assert "smon" not in " ".join(vars(model))  # nothing of SMon's on the instance
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    x = torch.randn(3, 16)
    assert torch.equal(model(x, factor=3.0), Scaled.forward(model, x, factor=3.0))
    model.load_state_dict(before)
    mon.step()
    mon.close()
    assert type(model) is Scaled
    assert kinds_per_step(ingest) == [["forward"]]


def test_pickle_and_deepcopy_give_the_original_class_untimed(ingest, attach_fast):
    model = Scaled()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address)
    pickled = pickle.dumps(model)
    assert b"smon" not in pickled  # unpickles where SMon is not installed
    copies = [copy.deepcopy(model), pickle.loads(pickled), copy.copy(model)]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copies.append(torch.load(buffer, weights_only=False))
    for twin in copies:
        assert type(twin) is Scaled
        pairs = zip(twin.state_dict().values(), model.state_dict().values(), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)
        twin(torch.randn(2, 16)).sum().backward()  # a copy's forwards are not the monitored model's
    one_step(model, optimizer)
    mon.close()
    assert kinds_per_step(ingest) == [["forward", "backward", "optimizer"]]


def test_detach_and_attach_again(ingest, attach_fast):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timed_classes = []  # weak: the test must not keep them alive
    for job in ("first", "second", "third"):
        mon = attach_fast(model, optimizer, server=ingest.address, job=job)
        timed_classes.append(weakref.ref(type(model)))
        one_step(model, optimizer)
        mon.close()
        assert type(model) is nn.Sequential
        one_step(model, optimizer)  # detached: trains, records nothing
    gc.collect()
    assert len(timed_classes) == 3 and all(ref() is None for ref in timed_classes)  # per attach, released
    for job in ("first", "second", "third"):
        steps = [s for b in ingest.servicer.snapshot() if b.coords.job == job for s in b.steps]
        assert [[s.kind for s in op_spans(step)] for step in steps] == [["forward", "backward", "optimizer"]]


def test_two_monitors_on_one_model_both_record(ingest, attach_fast):
    model = mlp()
    first = attach_fast(model, server=ingest.address, job="first")
    second = attach_fast(model, server=ingest.address, job="second")  # falls back to module hooks
    model(torch.randn(2, 16)).sum().backward()
    first.step()
    second.step()
    second.close()
    assert not model._forward_hooks and type(model) is not nn.Sequential
    first.close()
    assert type(model) is nn.Sequential
    for job in ("first", "second"):
        steps = [s for b in ingest.servicer.snapshot() if b.coords.job == job for s in b.steps]
        assert [[s.kind for s in op_spans(step)] for step in steps] == [["forward", "backward"]]


def test_instance_with_its_own_forward_is_timed_by_hooks(ingest, attach_fast):
    model = mlp()
    model.forward = model.forward  # an instance attribute would shadow a class's forward
    mon = attach_fast(model, server=ingest.address)
    assert type(model) is nn.Sequential and model._forward_hooks
    model(torch.randn(2, 16)).sum().backward()
    mon.step()
    mon.close()
    assert not model._forward_hooks
    assert kinds_per_step(ingest) == [["forward", "backward"]]


class Failing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1)
        self.fail = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("the user's error")
        return self.linear(x)


def test_a_forward_that_raises_propagates_and_leaves_no_span(ingest, attach_fast):
    model = Failing()
    mon = attach_fast(model, server=ingest.address)
    with pytest.raises(ValueError, match="the user's error"):
        model(torch.randn(2, 16))
    model.fail = False
    model(torch.randn(2, 16)).sum().backward()
    mon.step()
    mon.close()
    assert mon.counters()["errors"] == 0
    (step,) = ingest.servicer.steps()
    assert [(s.kind, s.microbatch) for s in op_spans(step)] == [("forward", 1), ("backward", 1)]


def test_user_module_hooks_still_run(ingest, attach_fast):
    model = mlp()
    seen: list[str] = []
    model.register_forward_pre_hook(lambda m, args: seen.append("pre"))
    mon = attach_fast(model, server=ingest.address)
    model.register_forward_hook(lambda m, args, out: seen.append("post"))
    model(torch.randn(2, 16)).sum().backward()
    mon.step()
    mon.close()
    assert seen == ["pre", "post"]
    assert kinds_per_step(ingest) == [["forward", "backward"]]


def test_a_class_swapped_again_after_attach_lets_the_closed_monitor_go(ingest, attach_fast):
    """FSDP2's `fully_shard` swaps the class again (a cached subclass of the timed one): close
    cannot put the original class back, but the timed `forward` (which holds the monitor) leaves
    that MRO, so the model still trains, untimed."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = attach_fast(model, optimizer, server=ingest.address, job="reswapped")
    wrapped = type("FSDPSequential", (type(model),), {})  # as fully_shard does, and caches
    model.__class__ = wrapped
    one_step(model, optimizer)
    mon.close()
    assert type(model) is wrapped and "forward" not in wrapped.__mro__[1].__dict__
    one_step(model, optimizer)  # trains, untimed (the timed forward, holding the monitor, is gone)
    steps = [s for b in ingest.servicer.snapshot() if b.coords.job == "reswapped" for s in b.steps]
    assert [[s.kind for s in op_spans(step)] for step in steps] == [["forward", "backward", "optimizer"]]
