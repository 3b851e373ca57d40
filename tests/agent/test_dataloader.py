"""data_wait timing leaves the user's `for batch in loader:` loop and loader object unchanged.

Loaders with worker processes are tested in test_fork_safety.py, in a process of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from tests.agent.torch_models import SlowDataset


def batches(loader) -> list[list[torch.Tensor]]:
    return [[t.clone() for t in batch] for batch in loader]


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True)
    )


def data_waits(ingest) -> list[float]:
    return [s.duration for step in ingest.servicer.steps() for s in step.spans if s.kind == "data_wait"]


def test_user_loop_sees_the_same_loader_and_batches(ingest, attach_fast):
    loader = DataLoader(SlowDataset(n=12), batch_size=4, shuffle=False)
    expected = batches(loader)
    original = type(loader)
    mon = attach_fast(dataloader=loader, server=ingest.address)
    assert isinstance(loader, DataLoader) and type(loader).__name__ == "DataLoader"
    assert len(loader) == 3 and loader.batch_size == 4
    for _ in range(2):  # two epochs, the loop exactly as the user wrote it
        seen = []
        for batch in loader:
            seen.append([t.clone() for t in batch])
            mon.step()
        assert same(seen, expected)
    iterator = iter(loader)
    assert isinstance(iterator, type(iter(DataLoader(SlowDataset(n=4)))))
    assert len(iterator) == 3
    next(iterator)
    assert iterator._num_yielded == 1  # the iterator's own attributes are intact
    mon.close()
    assert type(loader) is original
    assert len(data_waits(ingest)) == 6


def test_slow_loader_shows_as_data_wait(ingest, attach_fast):
    loader = DataLoader(SlowDataset(n=6, seconds=0.01), batch_size=3)
    mon = attach_fast(dataloader=loader, server=ingest.address)
    for _batch in loader:
        mon.step()
    mon.close()
    waits = data_waits(ingest)
    assert len(waits) == 2 and min(waits) >= 0.03


class GeneratorLoader:
    """A user-written loader whose __iter__ is a generator (its iterator's class cannot be swapped)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        yield from range(self.n)

    def __len__(self) -> int:
        return self.n


def test_generator_based_loader_is_timed_through_a_proxy(ingest, attach_fast):
    loader = GeneratorLoader(4)
    mon = attach_fast(dataloader=loader, server=ingest.address)
    seen = []
    for item in loader:
        seen.append(item)
        mon.step()
    assert seen == [0, 1, 2, 3] and isinstance(loader, GeneratorLoader) and len(loader) == 4
    mon.close()
    assert len(data_waits(ingest)) == 4


def test_unwrappable_loader_is_said_once_and_left_alone(ingest, attach_fast, caplog):
    loader = [1, 2, 3]  # a plain list: its class cannot be swapped
    with caplog.at_level(logging.WARNING, logger="smon"):
        mon = attach_fast(dataloader=loader, server=ingest.address)
    assert [x for x in loader] == [1, 2, 3] and type(loader) is list
    assert len([r for r in caplog.records if "cannot time data loading" in r.getMessage()]) == 1
    mon.close()
