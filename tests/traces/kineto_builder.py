"""Small Kineto (Chrome trace) documents for tests: one rank's profiled steps, with the event
names and categories torch.profiler writes (user annotations, autograd ops, gloo / NCCL
collectives, and on GPU traces kernels with the runtime launches they correlate to)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAIN, AUTOGRAD, GLOO = 100, 101, 102


@dataclass
class Step:
    """One step's phases, in milliseconds from the step's start (host clock)."""

    forward: float = 10.0
    backward: float = 20.0
    sync: float = 4.0  # the collective's length after backward (the exposed sync)
    optimizer: float = 2.0
    tail: float = 1.0
    forward_kernels: float = 0.0  # GPU traces: forward's kernels run this long past the annotation


@dataclass
class RankTraceDoc:
    rank: int
    world_size: int
    steps: list[Step]
    collective: str = "gloo"  # gloo | record_param_comms | ncclKernel | ncclDevKernel
    gpu: bool = False
    annotate_forward: bool = True
    start_ms: float = 1_000.0
    events: list[dict[str, Any]] = field(default_factory=list)

    def build(self) -> dict[str, Any]:
        t = self.start_ms
        correlation = 0
        for n, s in enumerate(self.steps):
            length = s.forward + s.backward + s.sync + s.optimizer + s.tail
            self._x(f"ProfilerStep#{n}", "user_annotation", t, length, MAIN)
            fwd_end = t + s.forward
            if self.annotate_forward:
                self._x(
                    "DistributedDataParallel.forward", "user_annotation", t + 0.01, s.forward - 0.01, MAIN
                )
            self._x("aten::linear", "cpu_op", t + 0.02, s.forward - 0.05, MAIN)
            if self.gpu and s.forward_kernels:
                correlation += 1
                self._x("cudaLaunchKernel", "cuda_runtime", t + 0.03, 0.01, MAIN, correlation=correlation)
                self._x(
                    "gemm_kernel",
                    "kernel",
                    t + 0.05,
                    s.forward + s.forward_kernels - 0.05,
                    7,
                    correlation=correlation,
                )
            bwd = fwd_end + 0.05
            half = (s.backward - 0.1) / 2
            self._x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", bwd, half, AUTOGRAD)
            self._x(
                "autograd::engine::evaluate_function: AccumulateGrad", "cpu_op", bwd + half, half, AUTOGRAD
            )
            bwd_end = bwd + 2 * half
            sync_start = bwd + half  # launched during backward, over `sync` ms after it
            sync_len = bwd_end + s.sync - sync_start
            if self.collective == "gloo":
                self._x("gloo:all_reduce", "user_annotation", sync_start, sync_len, GLOO)
            elif self.collective == "record_param_comms":
                self._x("record_param_comms", "cpu_op", sync_start, sync_len, GLOO)
            else:
                correlation += 1
                name = f"{self.collective}_AllReduce_RING_LL_Sum_float"
                self._x(
                    "cudaLaunchKernel",
                    "cuda_runtime",
                    sync_start - 0.01,
                    0.01,
                    AUTOGRAD,
                    correlation=correlation,
                )
                self._x(name, "kernel", sync_start, sync_len, 20, correlation=correlation)
            opt = bwd_end + s.sync + 0.02
            self._x("Optimizer.step#SGD.step", "user_annotation", opt, s.optimizer - 0.04, MAIN)
            t += length
        return {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl" if self.collective.startswith("nccl") else "gloo",
                                "rank": self.rank, "world_size": self.world_size},
            "traceEvents": self.events,
        }  # fmt: skip

    def _x(self, name: str, cat: str, ts_ms: float, dur_ms: float, tid: int, **args: Any) -> None:
        pid = 0 if cat == "kernel" else 4242
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
             "ts": ts_ms * 1000.0, "dur": dur_ms * 1000.0, "args": args}
        )  # fmt: skip

    def write(self, folder: Path, gz: bool = False) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.build())
        if gz:
            path = folder / f"worker{self.rank}.pt.trace.json.gz"
            with gzip.open(path, "wt") as f:
                f.write(text)
        else:
            path = folder / f"worker{self.rank}.pt.trace.json"
            path.write_text(text)
        return path
