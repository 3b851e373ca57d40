"""Per-step overhead of the SMon agent beside NVIDIA's straggler detector (prints figures; asserts nothing).

Four variants run in interleaved blocks in one run, each round in a rotated order, so drift and the
machine's noise fall on all of them alike:

- `none`: the training loop as a user writes it;
- `smon`: the same loop after `smon.attach(model, optimizer, dataloader)`, shipping to a real
  (acking) ingest server in a separate process;
- `nvidia`: the loop with nvidia-resiliency-ext's straggler detector as its README shows it
  (`Detector.initialize()`, `with Detector.detection_section(...)` around forward, backward and the
  optimizer step). Its CUPTI extension needs libcupti and a GPU, so `nvrx_cupti_module` is replaced
  by a stub whose start/stop do nothing: the detector's own Python (section bookkeeping, the
  CuptiManager lock and counter, CPU timers) runs as shipped, the kernel tracing does not, so on a
  GPU it costs at least this. `generate_report_if_interval_elapsed` needs CUDA and is not called;
- `A/A`: `none` again, the control: how far two identical variants drift apart here.

Figures:

1. Training-thread cost on a tiny single-process loop (8-wide MLP, batch 1, DataLoader, Adam), where
   the monitors' per-step work is all there is to time: training-thread CPU (`thread_time`) and
   wall clock per step (both means over the block), each minus the same round's `none` block,
   median and range over rounds.
2. Step time on a 2-rank gloo DDP job (spawned here, one intra-op thread per rank, MLP sized to a
   ~20 ms step): per block the median step on rank 0, ratio to the same round's `none` block, median
   and range over rounds.
3. The agent's CPU off the training thread (its feeder thread in the training process; its shipper
   process), per step of the tiny loop, from /proc.

nvidia-resiliency-ext (0.4.1 is the release the issue measured) is optional and not needed by
`make test`; install it without its dependencies, which would otherwise pull a CUDA torch:

    .venv/bin/pip install --no-deps nvidia-resiliency-ext==0.4.1
    .venv/bin/python benchmarks/agent_overhead.py [--rounds 10] [--ddp-rounds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

TARGET_STEP_MS = 20.0
WARMUP_STEPS = 5
VARIANTS = ("none", "smon", "nvidia", "A/A")


def serve(port_out: Any, stop: Any) -> None:
    """A minimal acking Ingest server (runs in a child process)."""
    import grpc

    from smon.v1 import ingest_pb2 as pb
    from smon.v1 import ingest_pb2_grpc as pb_grpc

    class Acker(pb_grpc.IngestServicer):
        def Stream(self, request_iterator: Iterator[pb.Batch], context: Any) -> Iterator[pb.Ack]:
            for batch in request_iterator:
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
    server.stop(None)


def make_loop(width: int, batch: int, n_batches: int) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    n = batch * n_batches
    data = torch.utils.data.TensorDataset(torch.randn(n, width), torch.randn(n, width))
    loader = torch.utils.data.DataLoader(data, batch_size=batch, drop_last=True)
    return model, optimizer, loader


def run_block(model: Any, optimizer: Any, loader: Any, steps: int) -> list[float]:
    """Seconds of each of `steps` training steps (data fetch included), written as a user writes them."""
    import torch

    times: list[float] = []
    while len(times) < steps:
        started = time.perf_counter()
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            now = time.perf_counter()
            times.append(now - started)
            started = now
            if len(times) == steps:
                break
    return times


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a whole process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def task_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def wait_until_shipping(mon: Any, timeout: float = 10.0) -> None:
    """Until the agent's first batch is acked (its shipper process has started and connected)."""
    deadline = time.monotonic() + timeout
    while mon.counters().get("acked_batches", 0) == 0 and time.monotonic() < deadline:
        mon.step()
        time.sleep(0.05)


def background_cpu_per_step(
    model: Any, optimizer: Any, loader: Any, *, steps: int, server: str
) -> tuple[float, float]:
    """CPU seconds per step: (agent threads in this process, the agent's shipper process)."""
    import smon

    baseline = task_cpu_seconds()
    mon: Any = smon.attach(model, optimizer, loader, server=server, job="bench-background", nvml_interval=5.0)
    try:
        wait_until_shipping(mon)
        outlet = mon.feeder.outlet
        shipper_start = process_cpu_seconds(outlet.pid) if hasattr(outlet, "pid") else 0.0
        run_block(model, optimizer, loader, steps)
        time.sleep(1.5)  # let the last records be batched and sent
        after = task_cpu_seconds()  # before close(): a joined thread leaves /proc with its CPU time
        shipper = (process_cpu_seconds(outlet.pid) if hasattr(outlet, "pid") else 0.0) - shipper_start
    finally:
        mon.close()
    threads = sum(v - baseline.get(t, 0.0) for t, v in after.items() if t not in baseline)
    return threads / steps, shipper / steps


# -- the variants ---------------------------------------------------------------------------------
def nvidia_detector() -> Any | None:
    """nvidia-resiliency-ext's Detector with its CUPTI extension stubbed, or None if not installed."""

    class _NoCupti:  # the C++ CuptiProfiler's interface; every call a no-op
        def __init__(self, **kwargs: Any) -> None:
            pass

        def initialize(self) -> None:
            pass

        def shutdown(self) -> None:
            pass

        def start(self) -> None:
            pass

        def stop(self) -> None:
            pass

        def get_stats(self) -> dict[str, Any]:
            return {}

        def reset(self) -> None:
            pass

    sys.modules.setdefault("nvrx_cupti_module", types.SimpleNamespace(CuptiProfiler=_NoCupti))  # type: ignore[arg-type]
    try:
        from nvidia_resiliency_ext.straggler import Detector
    except ImportError:
        return None
    return Detector


class Loop:
    """One training loop run as each variant: `block(variant)` → seconds of each timed step."""

    def __init__(self, model: Any, optimizer: Any, loader: Any, *, server: str, steps: int) -> None:
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.server, self.steps = server, steps
        self.detector = nvidia_detector()

    def _steps(self, n: int, section: Callable[[str], Any] | None) -> list[float]:
        import torch

        times: list[float] = []
        model, optimizer = self.model, self.optimizer
        while len(times) < n:
            started = time.perf_counter()
            for x, y in self.loader:
                if section is None:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                else:
                    with section("forward"):
                        loss = torch.nn.functional.mse_loss(model(x), y)
                    with section("backward"):
                        loss.backward()
                    with section("optimizer"):
                        optimizer.step()
                optimizer.zero_grad()
                now = time.perf_counter()
                times.append(now - started)
                started = now
                if len(times) == n:
                    break
        return times

    def block(self, variant: str) -> tuple[list[float], float]:
        """(seconds of each timed step, training-thread CPU seconds of the timed steps)."""
        section = None
        mon: Any = None
        if variant == "smon":
            import smon

            mon = smon.attach(
                self.model,
                self.optimizer,
                self.loader,
                server=self.server,
                job="bench-overhead",
                nvml_interval=5.0,
            )
        elif variant == "nvidia":
            if self.detector is None:
                return [], 0.0
            self.detector.initialize(scores_to_compute="all", gather_on_rank0=False)
            section = self.detector.detection_section
        try:
            # Un-timed steps first: after attach the loop has been idle, and on this VM an idle
            # pause alone makes the next steps slower; every variant therefore starts warm.
            self._steps(WARMUP_STEPS, section)
            if mon is not None:
                wait_until_shipping(mon)  # steady state: the shipper process's start-up is a one-off
                self._steps(WARMUP_STEPS, section)
            cpu = time.thread_time()
            times = self._steps(self.steps, section)
            return times, time.thread_time() - cpu
        finally:
            if mon is not None:
                mon.close()
            if variant == "nvidia" and self.detector is not None:
                self.detector.shutdown()


def rounds_of(
    loop: Loop, rounds: int, on_round: Callable[[int], None] | None = None, *, mean: bool = False
) -> dict[str, list[tuple[float, float]]]:
    """Per variant, per round: (median — or mean — step seconds, training-thread CPU seconds per step)."""
    out: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        if on_round is not None:
            on_round(r)
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            times, cpu = loop.block(variant)
            if times:
                wall = sum(times) / len(times) if mean else statistics.median(times)
                out[variant].append((wall, cpu / len(times)))
    return out


def spread(values: list[float], fmt: str) -> str:
    mid, lo, hi = (format(v, fmt) for v in (statistics.median(values), min(values), max(values)))
    return f"{mid} (range {lo} .. {hi})"


def report_tiny(results: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Per variant: µs per step over `none` of the same round (CPU and wall); returns CPU medians."""
    base = results["none"]
    print(
        f"  none: {statistics.median(w for w, _ in base) * 1e6:.1f} µs per step wall, "
        f"{statistics.median(c for _, c in base) * 1e6:.1f} µs training-thread CPU"
    )
    medians: dict[str, float] = {}
    for variant in VARIANTS[1:]:
        rows = results[variant]
        if not rows:
            print(f"  {variant:6s}: n/a (pip install --no-deps nvidia-resiliency-ext==0.4.1)")
            continue
        cpu = [(c - b[1]) * 1e6 for (_, c), b in zip(rows, base, strict=False)]
        wall = [(w - b[0]) * 1e6 for (w, _), b in zip(rows, base, strict=False)]
        medians[variant] = statistics.median(cpu)
        print(
            f"  {variant:6s}: training-thread CPU {spread(cpu, '+.1f')} µs/step; "
            f"wall {spread(wall, '+.1f')} µs/step"
        )
    return medians


def report_ddp(results: dict[str, list[tuple[float, float]]]) -> None:
    base = results["none"]
    print(f"  none: median step {statistics.median(w for w, _ in base) * 1e3:.2f} ms")
    for variant in VARIANTS[1:]:
        rows = results[variant]
        if not rows:
            print(f"  {variant:6s}: n/a")
            continue
        ratios = [w / b[0] for (w, _), b in zip(rows, base, strict=False)]
        over = [100 * (r - 1) for r in ratios]
        cpu = [(c - b[1]) * 1e6 for (_, c), b in zip(rows, base, strict=False)]
        print(
            f"  {variant:6s}: step time ratio {spread(ratios, '.4f')}, i.e. {spread(over, '+.2f')} %; "
            f"training-thread CPU {spread(cpu, '+.0f')} µs/step"
        )


# -- DDP ------------------------------------------------------------------------------------------
def ddp_rank(rank: int, port: int, server: str, rounds: int, steps: int, width: int, out: Any) -> None:
    """One rank of the 2-rank gloo job: calibrate a ~20 ms step, then the interleaved rounds."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    def loop_for(batch: int) -> Loop:
        model, optimizer, loader = make_loop(width, batch, 16)
        ddp = DDP(model)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-5)
        return Loop(ddp, optimizer, loader, server=server, steps=steps)

    best, gap = 8, float("inf")
    for batch in (4, 8, 16, 24, 32, 48, 64, 96, 128):
        loop = loop_for(batch)
        loop._steps(3, None)
        ms = torch.tensor([statistics.median(loop._steps(20, None)) * 1e3])
        dist.all_reduce(ms)  # both ranks decide on the same figures
        ms_mean = float(ms[0]) / 2
        if abs(ms_mean - TARGET_STEP_MS) < gap:
            best, gap = batch, abs(ms_mean - TARGET_STEP_MS)
        if ms_mean > 1.3 * TARGET_STEP_MS:
            break
    loop = loop_for(best)
    loop._steps(10, None)
    results = rounds_of(loop, rounds, on_round=lambda r: dist.barrier())
    if rank == 0:
        out.put((best, results))
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ddp(
    server: str, rounds: int, steps: int, width: int
) -> tuple[int, dict[str, list[tuple[float, float]]]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    ranks = [
        ctx.Process(target=ddp_rank, args=(r, port, server, rounds, steps, width, out)) for r in range(2)
    ]
    for p in ranks:
        p.start()
    result = out.get(timeout=3600)
    for p in ranks:
        p.join(60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the tiny loop (4 blocks each)")
    parser.add_argument("--tiny-steps", type=int, default=1000, help="steps per tiny-loop block")
    parser.add_argument("--ddp-rounds", type=int, default=8, help="rounds of the DDP job (0: skip it)")
    parser.add_argument("--ddp-steps", type=int, default=40, help="steps per DDP block")
    parser.add_argument("--width", type=int, default=512, help="MLP width of the DDP job")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    ctx = mp.get_context("spawn")
    port_out, stop = ctx.Queue(), ctx.Event()
    server_process = ctx.Process(target=serve, args=(port_out, stop), daemon=True)
    server_process.start()
    server = f"127.0.0.1:{port_out.get(timeout=30)}"
    try:
        import torch

        torch.set_num_threads(1)
        nvidia = nvidia_detector()
        print(
            f"torch {torch.__version__}, {os.cpu_count()} CPUs, one intra-op thread per process; ingest "
            f"server (separate process) at {server}; NVIDIA detector: "
            + ("nvidia-resiliency-ext, CUPTI stubbed" if nvidia is not None else "not installed")
        )
        tiny_model, tiny_optimizer, tiny_loader = make_loop(8, 1, 64)
        tiny = Loop(tiny_model, tiny_optimizer, tiny_loader, server=server, steps=args.tiny_steps)
        tiny._steps(300, None)
        print(
            f"1) tiny loop, {args.tiny_steps} steps per block, {args.rounds} rounds; "
            "cost over `none`, median (range):"
        )
        cpu = report_tiny(rounds_of(tiny, args.rounds, mean=True))

        if args.ddp_rounds:
            batch, ddp = run_ddp(server, args.ddp_rounds, args.ddp_steps, args.width)
            print(
                f"2) 2-rank gloo DDP, MLP {args.width}x3 + Adam, batch {batch} per rank, {args.ddp_steps} "
                f"steps per block, {args.ddp_rounds} rounds; rank 0, ratio to `none`, median (range):"
            )
            report_ddp(ddp)

        print("3) SMon's CPU off the training thread, 10000 tiny steps")
        if not os.path.isdir("/proc/self/task"):
            print("  n/a (needs /proc)")
            return
        in_process, shipper = background_cpu_per_step(
            tiny_model, tiny_optimizer, tiny_loader, steps=10_000, server=server
        )
        print(f"  feeder + NVML threads (training process): {in_process * 1e6:.1f} µs per step")
        print(f"  shipper process (batching, gzip, gRPC):    {shipper * 1e6:.1f} µs per step")
        if "smon" in cpu:
            total = cpu["smon"] * 1e-6 + in_process + shipper
            print(f"  all of SMon's CPU at a 20 ms step: {100 * total / 0.020:.2f}% of one core")
    finally:
        stop.set()
        server_process.join(5)


if __name__ == "__main__":
    main()
