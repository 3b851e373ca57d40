"""Sequence-length statistics: capture lengths cheaply on the training thread, reduce them later.

Attention cost grows with Σ len², so the server regresses micro-batch compute time on it to spot
sequence-length imbalance. Capturing must not slow training: on CPU the lengths are one small
tensor reduction; on CUDA they are reduced on the device and copied to pinned host memory with
`non_blocking=True`, then read on the shipper thread once their event has completed — never a
device synchronization.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

EventSource = Callable[[], Any] | None  # a device clock's pooled events (cuda_timing.CudaClock.lend_event)


class PendingLens:
    """Lengths still on their way from the device: a pinned host tensor and the event after the copy."""

    __slots__ = ("event", "host")

    def __init__(self, host: Any, event: Any) -> None:
        self.host = host
        self.event = event


@dataclass(slots=True)
class SeqSample:
    """Lengths of one micro-batch's sequences as captured (list, CPU tensor, or PendingLens)."""

    microbatch: int
    lengths: Any
    explicit: bool  # from mon.record_batch (wins over lengths read from forward kwargs)


@dataclass(slots=True)
class SeqTotals:
    count: int = 0
    tokens: int = 0
    sum_sq: float = 0.0
    max_len: int = 0

    def add(self, lengths: Iterable[int]) -> None:
        for n in lengths:
            self.count += 1
            self.tokens += n
            self.sum_sq += float(n) * float(n)
            if n > self.max_len:
                self.max_len = n

    def merge(self, other: SeqTotals) -> None:
        self.count += other.count
        self.tokens += other.tokens
        self.sum_sq += other.sum_sq
        self.max_len = max(self.max_len, other.max_len)


def capture_tensor(lengths: Any, events: EventSource = None) -> Any:
    """Keep a 1-D tensor of lengths without synchronizing with the device. The copy's event comes
    from `events` (a device clock's pool: returned with the step's marks) when given."""
    lengths = lengths.detach()
    if not lengths.is_cuda:
        return lengths
    import torch

    host = torch.empty(lengths.shape, dtype=lengths.dtype, device="cpu", pin_memory=True)
    host.copy_(lengths, non_blocking=True)
    event = events() if events is not None else torch.cuda.Event()
    event.record(torch.cuda.current_stream(lengths.device))
    return PendingLens(host, event)


def capture_explicit(seq_lens: Any, events: EventSource = None) -> Any:
    """Lengths handed to `mon.record_batch`: a sequence of ints, a numpy array or a tensor."""
    if hasattr(seq_lens, "is_cuda") and hasattr(seq_lens, "detach"):
        flat = seq_lens.detach().reshape(-1)
        # the caller may reuse its buffer
        return capture_tensor(flat if flat.is_cuda else flat.clone(), events)
    if hasattr(seq_lens, "tolist"):
        return seq_lens.tolist()
    return list(seq_lens)  # copy: the caller may reuse its list


def lengths_from_forward_kwargs(kwargs: dict[str, Any], events: EventSource = None) -> Any | None:
    """Lengths from packed `cu_seqlens` (offsets) or a 2-D padding `attention_mask`, if present."""
    import torch

    cu = kwargs.get("cu_seqlens")
    if cu is None:
        cu = kwargs.get("cu_seqlens_q")
    if isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.numel() >= 2:
        return capture_tensor(cu[1:] - cu[:-1], events)
    mask = kwargs.get("attention_mask")
    # 0/1 padding masks only: a float mask may be additive (0 / -inf), whose sum means nothing.
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not mask.is_floating_point():
        return capture_tensor(mask.sum(dim=-1), events)
    return None


def read_lengths(lengths: Any, *, force: bool = False) -> list[int] | None:
    """Host list of ints, or None while a device copy is still in flight (or never landed, when forced)."""
    if isinstance(lengths, PendingLens):
        if not lengths.event.query():
            return [] if force else None
        lengths = lengths.host
    if hasattr(lengths, "tolist"):
        lengths = lengths.tolist()
    return [int(n) for n in lengths]


def reduce_samples(
    samples: Sequence[SeqSample], *, force: bool = False
) -> tuple[SeqTotals, dict[int, SeqTotals]] | None:
    """Step totals and per-micro-batch totals; None while any sample is pending.

    If the step has explicit samples (`record_batch`), lengths read from forward kwargs are
    ignored for that step so the same sequences are not counted twice.
    """
    if any(s.explicit for s in samples):
        samples = [s for s in samples if s.explicit]
    per_microbatch: dict[int, SeqTotals] = {}
    for sample in samples:
        values = read_lengths(sample.lengths, force=force)
        if values is None:
            return None
        per_microbatch.setdefault(sample.microbatch, SeqTotals()).add(values)
    total = SeqTotals()
    for totals in per_microbatch.values():
        total.merge(totals)
    return total, per_microbatch
