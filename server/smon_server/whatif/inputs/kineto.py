"""PyTorch profiler (Kineto) Chrome traces of several ranks, as the step records an agent would send.

`smon analyze DIR` reads one trace per rank (`*.json` or `*.json.gz`, as `export_chrome_trace` or
`tensorboard_trace_handler` write them) and turns each profiled step into a step record with
spans, which then goes through the same op-table builder as a live job's records
(whatif/inputs/from_steps.py): nested spans carved, untimed stretches kept as `host` ops, steps re-cut at
the gradient sync. What each span is made of (docs/analysis.md, "Profiler traces"):

- a step: `ProfilerStep#N` (host annotation; N is the step number);
- `data_wait`: `enumerate(DataLoader)#...` annotations;
- `forward`: `*.forward` annotations (DDP / FSDP wrappers write them) or `## forward ##`; without
  one, the stretch from the data fetch to the first autograd op;
- `backward`: from the first to the last `autograd::engine::evaluate_function` op after each
  forward (one micro-batch per forward);
- `grad_sync` (the exposed gradient sync, as the agent times it): from the end of the step's last
  backward until its collectives are over: the last NCCL kernel's end, under both of NCCL's
  names (`ncclKernel*`, and `ncclDevKernel*` since NCCL 2.19: HTA#360 found no collective after
  the rename); without NCCL kernels, the last host-side collective's end (gloo / NCCL / UCC
  annotations, `record_param_comms` ops); without either, the end of DDP's write-back of the
  averaged gradients (`reducer::copy_bucket_to_grad`). It never runs past the optimizer's start;
- `optimizer`: `Optimizer.step#...` annotations.

On traces with GPU activity every host instant is moved to the device clock, where a CUDA event
recorded then would complete: `max(t, end of every kernel, copy and set launched before t)` (NCCL
kernels excepted: they are the collectives). So a phase lasts until the kernels it launched have
run, which is how the agent's CUDA-event timing measures it; compute comes from the kernels.
CPU-only traces keep host times: compute is the CPU ops.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smon_server.columns import StepColumns
from smon_server.whatif.inputs.trace import JobMeta, TraceError

TRACE_SUFFIXES = (".json", ".json.gz")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
# Host-side names of a collective: ProcessGroup annotations ("gloo:all_reduce", "nccl:all_reduce")
# and the param-comms op torch records for each collective call.
_HOST_COLLECTIVE = re.compile(r"^(gloo|nccl|ucc|mpi|xccl|c10d):|^record_param_comms$")
NCCL_KERNEL_PREFIXES = ("ncclKernel", "ncclDevKernel")
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"
# DDP's finalize copies each averaged bucket back into the gradients once its all-reduce is done.
_DDP_WRITE_BACK = "torch.distributed.ddp.reducer::copy_bucket_to_grad"
_US = 1e-6  # Kineto times are microseconds


def is_nccl_kernel(name: str) -> bool:
    return name.startswith(NCCL_KERNEL_PREFIXES)


@dataclass
class RankTrace:
    """What one rank's trace holds that the analysis uses, times in microseconds (Kineto's)."""

    path: Path
    rank: int
    host: str
    world_size: int
    steps: list[tuple[int, float, float]]  # (number, host start, host end)
    main_tid: Any
    data: list[tuple[float, float]] = field(default_factory=list)
    forward: list[tuple[float, float]] = field(default_factory=list)
    backward_ops: list[tuple[float, float]] = field(default_factory=list)
    optimizer: list[tuple[float, float]] = field(default_factory=list)
    collectives: list[tuple[float, float]] = field(default_factory=list)  # host-side, host times
    nccl: list[tuple[float, float]] = field(default_factory=list)  # NCCL kernels, device times
    write_back: list[tuple[float, float]] = field(default_factory=list)  # DDP's copy_bucket_to_grad
    device_launch: np.ndarray = field(default_factory=lambda: np.empty(0))  # sorted host launch times
    device_reach: np.ndarray = field(default_factory=lambda: np.empty(0))  # running max of their ends

    def device_time(self, t: np.ndarray | float) -> np.ndarray:
        """Where a CUDA event recorded at host time `t` would complete (`t` itself on CPU traces)."""
        t = np.asarray(t, dtype=np.float64)
        if not self.device_launch.size:
            return t
        at = np.searchsorted(self.device_launch, t, side="left") - 1
        reach = np.where(at >= 0, self.device_reach[np.maximum(at, 0)], -np.inf)
        return np.maximum(t, reach)


@dataclass(frozen=True)
class LoadedProfile:
    name: str
    columns: StepColumns
    ranks: list[RankTrace]
    hosts: dict[int, str]
    world_size: int
    files_rejected: list[str]  # "path: why"

    @property
    def several_hosts(self) -> bool:
        return len({r.host for r in self.ranks if r.host}) > 1


def trace_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def read_json(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: not a readable JSON trace ({e})") from e


def parse_rank(path: Path, raw: Any, fallback_rank: int) -> RankTrace:
    """One rank's trace; TraceError when it is no profiler trace or has no profiled step."""
    if isinstance(raw, list):
        raw = {"traceEvents": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list (not a Chrome trace)")
    info: dict[str, Any] = raw.get("distributedInfo") or {}
    if not isinstance(info, dict):
        info = {}
    rank = _int(info.get("rank"))
    if rank is None:
        named = _RANK_IN_NAME.search(path.name)
        rank = int(named.group(1)) if named else fallback_rank
    steps: list[tuple[int, float, float, Any, Any]] = []
    annotations: list[tuple[str, float, float, Any]] = []
    backward: list[tuple[float, float]] = []
    write_back: list[tuple[float, float]] = []
    host_collectives: list[tuple[float, float]] = []
    nccl: list[tuple[float, float]] = []
    device: list[tuple[Any, float]] = []  # (correlation, end)
    launches: dict[Any, float] = {}
    for e in raw["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name, cat = e.get("name"), e.get("cat")
        if not isinstance(name, str) or not _number(e.get("ts")) or not _number(e.get("dur")):
            continue
        ts, dur = float(e["ts"]), float(e["dur"])
        if dur < 0:
            continue
        if cat == "gpu_user_annotation":
            continue  # device-side copies of host annotations
        if cat in _DEVICE_CATS:
            if is_nccl_kernel(name):
                nccl.append((ts, ts + dur))
            else:
                args = e.get("args") or {}
                device.append((args.get("correlation"), ts + dur))
            continue
        if cat in _LAUNCH_CATS:
            correlation = (e.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = ts
            continue
        if name.startswith(_BACKWARD_PREFIX):
            backward.append((ts, ts + dur))
        elif name == _DDP_WRITE_BACK:
            write_back.append((ts, ts + dur))
        elif _HOST_COLLECTIVE.match(name):
            host_collectives.append((ts, ts + dur))
        elif step := _STEP.match(name):
            steps.append((int(step.group(1)), ts, ts + dur, e.get("pid"), e.get("tid")))
        elif cat == "user_annotation":  # not python_function: with_stack names every call
            annotations.append((name, ts, ts + dur, e.get("tid")))
    if not steps:
        raise TraceError(f"{path}: no ProfilerStep#N annotations (record with prof.step() each step)")
    steps.sort(key=lambda s: s[1])
    main_tid = steps[0][4]
    trace = RankTrace(
        path=path,
        rank=rank,
        host=str(raw.get("host_name") or ""),
        world_size=_int(info.get("world_size")) or 0,
        steps=[(n, a, b) for n, a, b, _, _ in steps],
        main_tid=main_tid,
        backward_ops=sorted(backward),
        collectives=sorted(host_collectives),
        nccl=sorted(nccl),
        write_back=sorted(write_back),
    )
    for name, start, end, tid in annotations:
        if tid != main_tid:
            continue
        if name.startswith("enumerate(DataLoader)#"):
            trace.data.append((start, end))
        elif name.endswith(".forward") or name == "## forward ##":
            trace.forward.append((start, end))
        elif name.startswith("Optimizer.step#"):
            trace.optimizer.append((start, end))
    pairs = [(launches[c], end) for c, end in device if c in launches]
    if pairs:
        arr = np.array(sorted(pairs), dtype=np.float64)
        trace.device_launch = arr[:, 0]
        trace.device_reach = np.maximum.accumulate(arr[:, 1])
    return trace


def step_spans(trace: RankTrace, start: float, end: float) -> list[tuple[str, float, float, int]]:
    """(kind, host start, host end, micro-batch) of one step's phases, before the device mapping."""

    def inside(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
        return _merge([(a, b) for a, b in intervals if start <= a < end])

    spans: list[tuple[str, float, float, int]] = [("data_wait", a, b, -1) for a, b in inside(trace.data)]
    forwards = inside(trace.forward)
    bwd = [(a, b) for a, b in trace.backward_ops if start <= a < end]
    optim = inside(trace.optimizer)
    if not forwards and bwd:
        # No forward annotation (a bare module): forward runs from the data fetch to backward.
        fetched = max([b for _, b in inside(trace.data)] + [start])
        if bwd[0][0] > fetched:
            forwards = [(fetched, bwd[0][0])]
    for i, (a, b) in enumerate(forwards):
        spans.append(("forward", a, b, i))
    # One backward per forward (gradient accumulation): the autograd ops between two forwards.
    starts = np.array([a for a, _ in forwards]) if forwards else np.array([start])
    passes: dict[int, tuple[float, float]] = {}
    for a, b in bwd:
        k = max(int(np.searchsorted(starts, a, side="right")) - 1, 0)
        lo, hi = passes.get(k, (a, b))
        passes[k] = (min(lo, a), max(hi, b))
    for k, (a, b) in sorted(passes.items()):
        spans.append(("backward", a, b, k if forwards else -1))
    spans += [("optimizer", a, b, -1) for a, b in optim]
    return spans


def rank_records(trace: RankTrace, kinds: dict[str, int]) -> list[tuple[int, float, float, list[tuple]]]:
    """Per profiled step: (step, start s, duration s, [(kind code, offset s, duration s, mb)]),
    on the device clock (the host clock on CPU-only traces)."""
    records = []
    for number, h0, h1 in trace.steps:
        raw = step_spans(trace, h0, h1)
        bounds = trace.device_time(np.array([h0, h1] + [t for span in raw for t in span[1:3]]))
        s0, s1 = float(bounds[0]), float(bounds[1])
        mapped = [
            (kind, float(bounds[2 + 2 * i]), float(bounds[3 + 2 * i]), mb)
            for i, (kind, _, _, mb) in enumerate(raw)
        ]
        sync = _grad_sync(trace, raw, mapped, h1, s1)
        if sync is not None:
            mapped.append(("grad_sync", *sync, -1))
        mapped.sort(key=lambda span: (span[1], span[1] - span[2]))
        spans = [
            (kinds.setdefault(k, len(kinds)), (a - s0) * _US, (b - a) * _US, mb) for k, a, b, mb in mapped
        ]
        records.append((number, s0 * _US, (s1 - s0) * _US, spans))
    return records


def _grad_sync(
    trace: RankTrace,
    raw: list[tuple[str, float, float, int]],
    mapped: list[tuple[str, float, float, int]],
    h1: float,
    s1: float,
) -> tuple[float, float] | None:
    """The exposed gradient sync of one step (device clock), or None when the step has none.

    Every step with a collective after its backward gets one, if only of zero length: a rank
    whose sync was hidden still took part, and its start is what tells transfer from waiting."""
    backward = [i for i, span in enumerate(raw) if span[0] == "backward"]
    if not backward:
        return None
    host_start = raw[backward[-1]][1]  # the last backward pass's start, host clock
    end = max(mapped[i][2] for i in backward)
    limit = min([a for k, a, _, _ in mapped if k == "optimizer" and a >= end] + [s1])
    device_start = mapped[backward[-1]][1]
    kernels = [b for a, b in trace.nccl if b > device_start and a < limit]
    if kernels:
        over = max(kernels)
    else:
        ends = [b for a, b in trace.collectives if b > host_start and a < h1]
        # Without a collective in the trace, DDP's write-back of the averaged gradients (it runs
        # once the last bucket has arrived) marks the end of the sync.
        bounds = [max(ends)] if ends else [b for a, b in trace.write_back if host_start < a < h1][-1:]
        if not bounds:
            return None
        over = bounds[0]
    return end, min(max(over, end), limit)


def load_profile(directory: str | Path, meta: JobMeta | None = None) -> LoadedProfile:
    """Every rank's trace in `directory`. A file that is no usable trace is reported and skipped;
    none usable is a TraceError."""
    d = Path(directory)
    if not d.is_dir():
        raise TraceError(f"{d} is not a folder of profiler traces")
    files = trace_files(d)
    if not files:
        raise TraceError(f"{d} holds no profiler traces (*.json, *.json.gz)")
    traces: list[RankTrace] = []
    rejected: list[str] = []
    for i, path in enumerate(files):
        try:
            traces.append(parse_rank(path, read_json(path), i))
        except TraceError as e:
            rejected.append(str(e))
    seen: dict[int, Path] = {}
    for t in list(traces):
        if t.rank in seen:
            rejected.append(f"{t.path}: rank {t.rank} again (also in {seen[t.rank].name}); skipped")
            traces.remove(t)
        else:
            seen[t.rank] = t.path
    if not traces:
        raise TraceError(f"{d}: no usable profiler trace ({'; '.join(rejected)})")
    traces.sort(key=lambda t: t.rank)
    world = max([t.world_size for t in traces] + [meta.world_size if meta else 0, len(traces)])
    kinds: dict[str, int] = {}
    rows = []
    for t in traces:
        dp, pp, tp = _coordinates(t.rank, world, meta)
        for number, start, duration, spans in rank_records(t, kinds):
            rows.append((t.rank, number, dp, pp, tp, start, duration, spans))
    return LoadedProfile(
        name=d.name,
        columns=_columns(rows, kinds),
        ranks=traces,
        hosts={t.rank: t.host for t in traces if t.host},
        world_size=world,
        files_rejected=rejected,
    )


def _coordinates(rank: int, world: int, meta: JobMeta | None) -> tuple[int, int, int]:
    """(dp, pp, tp) of a global rank in Megatron's default order (tp fastest, then dp, then pp)."""
    tp = max(1, meta.tp_size * meta.cp_size) if meta else 1
    pp = max(1, meta.pp_size) if meta else 1
    dp = max(1, world // (tp * pp))
    return (rank // tp) % dp, (rank // (tp * dp)) % pp, rank % tp


def _columns(rows: Iterable[tuple], kinds: dict[str, int]) -> StepColumns:
    rows = list(rows)
    spans = [s for r in rows for s in r[7]]
    span_arr = np.array(spans, dtype=np.float64).reshape(-1, 4)
    n = len(rows)

    def col(i: int, dtype: type) -> np.ndarray:
        return np.array([r[i] for r in rows], dtype=dtype)

    return StepColumns(
        kinds=tuple(kinds),
        rank=col(0, np.int64),
        step=col(1, np.int64),
        dp_rank=col(2, np.int32),
        pp_rank=col(3, np.int32),
        tp_rank=col(4, np.int32),
        start_time=col(5, np.float64),
        duration=col(6, np.float64),
        gc_count=np.zeros(n, dtype=np.int32),
        gc_seconds=np.zeros(n),
        seq_sum_sq=np.zeros(n),
        span_count=np.array([len(r[7]) for r in rows], dtype=np.int64),
        span_kind=span_arr[:, 0].astype(np.int32),
        span_start=span_arr[:, 1],
        span_duration=span_arr[:, 2],
        span_microbatch=span_arr[:, 3].astype(np.int32),
        span_chunk=np.zeros(len(spans), dtype=np.int32),
        mb_count=np.zeros(n, dtype=np.int64),
        mb_index=np.zeros(0, dtype=np.int32),
        mb_sum_sq=np.zeros(0),
    )


def _merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals (nested annotations of one kind count once)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None
