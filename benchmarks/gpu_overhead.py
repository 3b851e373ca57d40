"""The agent's cost on a real GPU step, beside NVIDIA's straggler detector (prints figures; asserts nothing).

Identical copies of a small GPT, one per variant, in one process on one GPU, run in interleaved
blocks of `--block` steps, `--rounds` rounds, each round in a shuffled order; a block starts and
ends with `torch.cuda.synchronize()`, and no step reads the loss (the host runs ahead, as in a
real loop that logs rarely). Per round: each variant's step time over `none`'s, and its
training-thread CPU (`thread_time`) per step minus `none`'s.

- `none`: the loop as a user writes it (bf16 autocast, AdamW);
- `A/A`: `none` again, the control: what two identical copies differ by;
- `smon`: after `smon.attach(model, optimizer)` with the defaults (CUDA-event timing of sampled
  blocks of steps, sampling.py);
- `smon-every`: the same with `device_sampling=1` (every step device-timed): the cost of timing
  every step, and the reference `smon`'s figures are compared with;
- `smon-host`: `timing="host"` (host timestamps only);
- `nvidia`: nvidia-resiliency-ext's straggler Detector with CUPTI kernel tracing on
  (`detection_section(..., profile_cuda=True)` around forward, backward and the optimizer step),
  where the package imports (0.4.1 is the release issue 29 measured; it needs libcupti 12).

Two step sizes: `launch-bound` (d 256, 2 layers, seq 128, batch 4: ~8 ms on an H200, the CPU
launching kernels is the bottleneck) and `23ms` (d 1024, 8 layers, seq 512, batch 8).

What SMon reports must stay device truth: its records (received by the acking server this
benchmark runs) give per-phase means over the steps it timed, set beside `smon-every`'s over every
step of the same run.

Without CUDA it says why and exits, unless `--fake`: then the same machinery runs on the CPU with
`smon.testing.FakeCuda` events (a smoke test of this script; its figures mean nothing).

    python benchmarks/gpu_overhead.py [--rounds 40] [--block 20] [--sizes launch-bound,23ms]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

VOCAB = 4096
SIZES: dict[str, dict[str, int]] = {
    "launch-bound": dict(d=256, layers=2, seq=128, batch=4),
    "23ms": dict(d=1024, layers=8, seq=512, batch=8),
}
FAKE_SIZE = dict(d=32, layers=1, seq=16, batch=2)
VARIANTS = ("none", "A/A", "smon", "smon-every", "smon-host", "nvidia")
PHASES = ("forward", "backward", "optimizer")


def serve(port_out: Any, stop: Any, report: Any) -> None:
    """An acking Ingest server (a child process) that keeps, per job, what SMon's records say:
    steps received, the sum of each phase and of step durations."""
    import grpc

    from smon.v1 import ingest_pb2 as pb
    from smon.v1 import ingest_pb2_grpc as pb_grpc

    totals: dict[str, dict[str, float]] = {}

    class Acker(pb_grpc.IngestServicer):
        def Stream(self, request_iterator: Iterator[pb.Batch], context: Any) -> Iterator[pb.Ack]:
            for batch in request_iterator:
                job = totals.setdefault(batch.coords.job, {"steps": 0.0, "duration": 0.0})
                for step in batch.steps:
                    job["steps"] += 1
                    job["duration"] += step.duration
                    for phase, seconds in step.phases.items():
                        job[phase] = job.get(phase, 0.0) + seconds
                yield pb.Ack(
                    agent_id=batch.agent_id, seq=batch.seq, accepted=len(batch.steps) + len(batch.gpu_samples)
                )

        def Clock(self, request: pb.ClockRequest, context: Any) -> pb.ClockReply:
            return pb.ClockReply(agent_time=request.agent_time, server_time=time.time())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_IngestServicer_to_server(Acker(), server)
    port_out.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    report.put(json.loads(json.dumps(totals)))
    server.stop(None)


def make_gpt(size: dict[str, int], device: Any) -> Any:
    import torch
    from torch import nn

    d, layers, seq = size["d"], size["layers"], size["seq"]

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, d)
            self.pos = nn.Embedding(seq, d)
            layer = nn.TransformerEncoderLayer(
                d, max(1, d // 64), 4 * d, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, VOCAB)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
            return self.head(self.blocks(x, mask=mask, is_causal=True))

    torch.manual_seed(0)
    return GPT().to(device)


def nvidia_detector() -> tuple[Any | None, str]:
    try:
        from nvidia_resiliency_ext.straggler import Detector

        Detector.initialize(
            scores_to_compute=["relative_perf_scores", "individual_perf_scores"],
            gather_on_rank0=False,
            profiling_interval=1,
        )
        return Detector, ""
    except Exception as exc:  # optional: not installed, no libcupti, ...
        return None, f"{type(exc).__name__}: {exc}"[:300]


class Bench:
    """The variants of one step size: their models, optimizers, monitors and a block runner."""

    def __init__(self, size: dict[str, int], device: Any, server: str, fake: bool, tag: str) -> None:
        import torch

        import smon

        self.torch = torch
        self.device = device
        self.fake_cuda: Any = None
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.inputs = [torch.randint(0, VOCAB, (size["batch"], size["seq"]), device=device) for _ in range(4)]
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16)
        self.models: dict[str, tuple[Any, Any]] = {}
        self.monitors: dict[str, Any] = {}
        self.jobs: dict[str, str] = {}
        self.notes: dict[str, str] = {}
        self.detector: Any = None
        for variant in VARIANTS:
            if variant == "nvidia":
                self.detector, why = nvidia_detector()
                if self.detector is None:
                    self.notes["nvidia"] = f"not run: {why}"
                    continue
            model = make_gpt(size, device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            self.models[variant] = (model, optimizer)
            if variant.startswith("smon"):
                job = f"gpu-overhead-{tag}-{variant}-{os.getpid()}"
                options: dict[str, Any] = dict(job=job, server=server, nvml_interval=0)
                if variant == "smon-host":
                    options["timing"] = "host"
                elif variant == "smon-every":
                    options["device_sampling"] = 1
                if fake and variant != "smon-host":
                    from smon.cuda_timing import CudaClock
                    from smon.sampling import DeviceSampling
                    from smon.testing import FakeCuda

                    self.fake_cuda = self.fake_cuda or FakeCuda()
                    sampling = DeviceSampling(1 if variant == "smon-every" else None)
                    options["timing"] = CudaClock(self.fake_cuda, sampling=sampling)
                monitor = smon.attach(model, optimizer, **options)
                if not monitor.enabled:
                    raise SystemExit(f"smon.attach did not start for {variant}: see the log above")
                self.monitors[variant] = monitor
                self.jobs[variant] = job

    @property
    def variants(self) -> list[str]:
        return list(self.models)

    def block(self, variant: str, steps: int) -> tuple[float, float]:
        """(seconds per step, training-thread CPU seconds per step) of `steps` steps."""
        torch, (model, optimizer) = self.torch, self.models[variant]
        cross_entropy = torch.nn.functional.cross_entropy
        section = self.detector.detection_section if variant == "nvidia" else None
        self.sync()
        cpu, wall = time.thread_time(), time.perf_counter()
        for i in range(steps):
            x = self.inputs[i % 4]
            if section is None:
                with self.autocast:
                    loss = cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            else:
                with section("fwd", profile_cuda=True), self.autocast:
                    loss = cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
                optimizer.zero_grad(set_to_none=True)
                with section("bwd", profile_cuda=True):
                    loss.backward()
                with section("opt", profile_cuda=True):
                    optimizer.step()
        self.sync()
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if self.fake_cuda is not None:
            self.fake_cuda.advance(wall * 1e3)
            self.fake_cuda.complete_all()  # the fake device has caught up
        return wall / steps, cpu / steps

    def close(self) -> None:
        for monitor in self.monitors.values():
            monitor.close(timeout=10.0)
        if self.detector is not None:
            with contextlib.suppress(Exception):
                self.detector.shutdown()


def median_ci(values: list[float], level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """Bootstrap interval of the median over rounds (percentile method, fixed seed)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(0)
    medians = np.median(data[rng.integers(0, len(data), (resamples, len(data)))], axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def spread(values: list[float], fmt: str) -> dict[str, Any]:
    q1, mid, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (math.nan,) * 3
    lo, hi = median_ci(values) if len(values) > 1 else (math.nan, math.nan)
    text = (
        f"{format(mid, fmt)} (95% CI {format(lo, fmt)} .. {format(hi, fmt)}; "
        f"IQR {format(q1, fmt)} .. {format(q3, fmt)})"
    )
    return {"median": mid, "ci": [lo, hi], "iqr": [q1, q3], "text": text}


def run_size(
    tag: str, size: dict[str, int], args: argparse.Namespace, server: str, device: Any
) -> dict[str, Any]:
    bench = Bench(size, device, server, args.fake, tag)
    names = bench.variants
    for name in names:  # warm-up: allocator, autotuning, lazy init, the agent's first blocks
        bench.block(name, args.block)
    rng = random.Random(args.seed)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.rounds):
        rng.shuffle(names)
        for name in names:
            w, c = bench.block(name, args.block)
            wall[name].append(w)
            cpu[name].append(c)
    skipped = {v: getattr(m.tracker, "skipped", 0) for v, m in bench.monitors.items()}
    periods = {
        v: getattr(getattr(m.tracker.clock, "sampling", None), "period", None)
        for v, m in bench.monitors.items()
    }
    bench.close()
    out: dict[str, Any] = {
        "size": size,
        "step_ms_none": statistics.median(wall["none"]) * 1e3,
        "notes": bench.notes,
        "jobs": bench.jobs,
        "steps_not_recorded": skipped,
        "device_sampling_period": periods,
        "ratio": {},
        "cpu_us": {},
    }
    for name in wall:
        if name == "none":
            continue
        out["ratio"][name] = spread([a / b for a, b in zip(wall[name], wall["none"], strict=True)], ".4f")
        out["cpu_us"][name] = spread(
            [(a - b) * 1e6 for a, b in zip(cpu[name], cpu["none"], strict=True)], "+.1f"
        )
    return out


def device_truth(result: dict[str, Any], totals: dict[str, dict[str, float]]) -> dict[str, Any]:
    """SMon's per-phase means over the steps it timed beside `smon-every`'s over every step."""
    sampled, every = (
        totals.get(result["jobs"].get("smon", ""), {}),
        totals.get(result["jobs"].get("smon-every", ""), {}),
    )
    if not sampled.get("steps") or not every.get("steps"):
        return {"error": "no records from one of the variants"}
    rows: dict[str, Any] = {"steps": {"smon": sampled["steps"], "smon-every": every["steps"]}}
    for phase in (*PHASES, "duration"):
        a, b = sampled.get(phase, 0.0) / sampled["steps"], every.get(phase, 0.0) / every["steps"]
        rows[phase] = {"smon_ms": a * 1e3, "every_ms": b * 1e3, "ratio": a / b if b else math.nan}
    return rows


def print_report(tag: str, result: dict[str, Any]) -> None:
    print(f"\n== {tag}: none's step {result['step_ms_none']:.2f} ms ({result['size']})")
    for note in result["notes"].values():
        print(f"   note: {note}")
    print(f"   device sampling period: {result['device_sampling_period']}")
    print(f"   steps not recorded: {result['steps_not_recorded']}")
    print(f"   {'variant':<11} {'step time / none':<58} training-thread CPU µs/step over none")
    for name, ratio in result["ratio"].items():
        print(f"   {name:<11} {ratio['text']:<58} {result['cpu_us'][name]['text']}")
    truth = result.get("device_truth", {})
    if "error" in truth:
        print(f"   device truth: {truth['error']}")
    elif truth:
        print(
            f"   device truth (steps: {truth['steps']}): SMon's mean over the steps it timed / every step's"
            " (a block's first step holds the other variants' turn: duration is not comparable)"
        )
        for phase in (*PHASES, "duration"):
            row = truth[phase]
            print(
                f"     {phase:<10} {row['smon_ms']:8.3f} ms / {row['every_ms']:8.3f} ms = {row['ratio']:.4f}"
            )
    bound = 1.01 if tag == "launch-bound" else 1.005
    smon, nvidia = result["ratio"].get("smon"), result["ratio"].get("nvidia")
    if smon:
        hi = smon["ci"][1]
        print(
            f"   target: smon <= {bound} of none: median {smon['median']:.4f}, CI high {hi:.4f} -> "
            f"{'met' if hi <= bound else ('not shown' if smon['median'] <= bound else 'missed')}"
        )
        cpu = result["cpu_us"]["smon"]
        print(
            f"   target: smon CPU <= 40 µs/step over none: {cpu['median']:+.1f} -> "
            f"{'met' if cpu['ci'][1] <= 40 else 'not shown'}"
        )
        if nvidia:
            print(
                f"   target: smon below nvidia: {smon['median']:.4f} vs {nvidia['median']:.4f} -> "
                f"{'met' if smon['ci'][1] < nvidia['ci'][0] else 'not shown'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fake", action="store_true", help="CPU, FakeCuda events: a smoke test of this script"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    import torch

    logging.getLogger("smon").setLevel(logging.ERROR)  # (several monitors in one process: said once each)
    if args.fake:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        print("gpu_overhead: skipped: no CUDA device (torch.cuda.is_available() is False); --fake: CPU")
        return
    logging_level = os.environ.get("SMON_LOG_LEVEL")
    if logging_level is None:
        os.environ["SMON_LOG_LEVEL"] = "ERROR"
    ctx = mp.get_context("spawn")
    port_q, report_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=serve, args=(port_q, stop, report_q), daemon=True)
    proc.start()
    server = f"127.0.0.1:{port_q.get(timeout=60)}"
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    sizes = {"fake": FAKE_SIZE} if args.fake else {t: SIZES[t] for t in args.sizes.split(",") if t}
    results = {tag: run_size(tag, size, args, server, device) for tag, size in sizes.items()}
    stop.set()
    totals = report_q.get(timeout=60)
    proc.join(timeout=10)
    for tag, result in results.items():
        result["device_truth"] = device_truth(result, totals)
        print_report(tag, result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
