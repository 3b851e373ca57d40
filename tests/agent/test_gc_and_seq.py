"""GC pauses and sequence-length statistics in step records."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from smon.v1 import ingest_pb2 as pb


class Node:
    def __init__(self) -> None:
        self.ref: Node | None = None


def make_cycles(n: int) -> None:
    for _ in range(n):
        a, b = Node(), Node()
        a.ref, b.ref = b, a


def only_step(ingest) -> pb.StepRecord:
    (step,) = ingest.servicer.steps()
    return step


def test_gc_pauses_are_counted_and_long_ones_become_spans(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    mon.step()  # step 0: whatever
    with mon.phase("forward"):
        make_cycles(200_000)
        gc.collect()  # a full collection of 400k objects: well over the 1 ms span threshold
    mon.step()
    mon.close()
    step = next(s for s in ingest.servicer.steps() if s.step == 1)
    assert step.gc_count >= 1 and step.gc_seconds > 0.001
    gc_spans = [s for s in step.spans if s.kind == "gc"]
    assert gc_spans and sum(s.duration for s in gc_spans) <= step.gc_seconds + 1e-9
    forward = next(s for s in step.spans if s.kind == "forward")
    big = max(gc_spans, key=lambda s: s.duration)
    assert forward.start <= big.start and big.start + big.duration <= forward.start + forward.duration + 1e-6
    assert step.phases["gc"] == pytest.approx(step.gc_seconds)


def test_record_batch_sequence_stats_per_step_and_microbatch(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    mon.record_batch([3, 4], microbatch=0)
    mon.record_batch(torch.tensor([10]), microbatch=1)
    mon.record_batch([1, 1, 1], microbatch=1)
    mon.step()
    mon.close()
    step = only_step(ingest)
    assert (step.seq.count, step.seq.tokens, step.seq.sum_sq, step.seq.max_len) == (6, 20, 128.0, 10)
    per = {m.microbatch: m.seq for m in step.microbatch_seq}
    assert (per[0].count, per[0].tokens, per[0].sum_sq, per[0].max_len) == (2, 7, 25.0, 4)
    assert (per[1].count, per[1].tokens, per[1].sum_sq, per[1].max_len) == (4, 13, 103.0, 10)


class MaskedModel(nn.Module):
    """Takes an attention mask or packed cu_seqlens as keyword arguments, like HF / flash-attn models."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.lin(x).sum()


def test_lengths_read_from_attention_mask_and_cu_seqlens(ingest, attach_fast):
    model = MaskedModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = attach_fast(model, optimizer, server=ingest.address)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    model(torch.randn(2, 4), attention_mask=mask).backward()  # micro-batch 0: lengths 3, 2
    model(torch.randn(2, 4), cu_seqlens=torch.tensor([0, 5, 6, 10])).backward()  # micro-batch 1: 5, 1, 4
    optimizer.step()
    # Explicit lengths win over detected ones for the whole step (no double counting).
    model(torch.randn(2, 4), attention_mask=mask).backward()
    mon.record_batch([7])
    optimizer.step()
    mon.close()
    first, second = sorted(ingest.servicer.steps(), key=lambda s: s.step)
    per = {m.microbatch: (m.seq.count, m.seq.tokens, m.seq.max_len) for m in first.microbatch_seq}
    assert per == {0: (2, 5, 3), 1: (3, 10, 5)}
    assert first.seq.sum_sq == 9 + 4 + 25 + 1 + 16
    assert (second.seq.count, second.seq.tokens) == (1, 7)
    assert second.microbatch_seq[0].microbatch == 1  # recorded after forward 0: the next micro-batch


def test_step_without_sequences_has_no_seq_stats(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    mon.step()
    mon.close()
    step = only_step(ingest)
    assert not step.HasField("seq") and not step.microbatch_seq
