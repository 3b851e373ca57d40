"""Per-step overhead of the SMon agent on a CPU training loop (prints figures; asserts nothing).

Three figures, all from one process:

1. Wall clock on a ~20 ms step (a 3-layer MLP with Adam, batches from a DataLoader). The loop
   runs in blocks, alternately without and with the agent (attach before the block, close after
   it; ABBA order so drift cancels). Every step is timed on its own and a block is summarised by
   its median step; the figure is the median over repetitions of agent / plain. The same protocol
   run plain-vs-plain ("A/A") is printed beside it: on a small shared machine that noise floor is
   often wider than the effect being measured, hence figures 2 and 3.
2. The agent's cost on the training thread, in µs per step: the same comparison on a near-empty
   step (a tiny model), where hooks, spans and the step hand-off are all there is to time.
3. The CPU time the agent spends off the training thread, in µs per step, from /proc: its threads
   in the training process (the feeder, which turns marks into records, and the NVML sampler) and
   its shipper process (batching, compression, gRPC; a separate process at lower priority, so it
   competes for cores but not for the training process's GIL). Measured over one long run of the
   tiny loop: its thousands of records per second make the 10 ms /proc tick negligible, and the
   work is per record (plus per batch and per heartbeat, once a second).

The estimate at the end is (2 + 3) / step time. The agent ships to a real ingest server running
in a separate process (standing in for the remote server) that acks every batch, so the shipper's
serialization, compression and gRPC work are all included.

    .venv/bin/python benchmarks/agent_overhead.py [--reps 10] [--steps 40]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

TARGET_STEP_MS = 20.0
WARMUP_STEPS = 5


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


class Interleaving:
    """ABBA blocks of a loop with and without the agent; per-block median step times."""

    def __init__(self, model: Any, optimizer: Any, loader: Any, *, steps: int, server: str) -> None:
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.steps, self.server = steps, server

    def timed(self) -> float:
        # Un-timed steps first: after attach the loop has been idle (waiting for the shipper), and
        # on this VM an idle pause alone makes the next block ~2-3% slower; both kinds of block
        # therefore start warm.
        run_block(self.model, self.optimizer, self.loader, WARMUP_STEPS)
        return statistics.median(run_block(self.model, self.optimizer, self.loader, self.steps))

    def plain_block(self) -> float:
        return self.timed()

    def agent_block(self) -> float:
        import smon

        mon = smon.attach(
            self.model,
            self.optimizer,
            self.loader,
            server=self.server,
            job="bench-overhead",
            nvml_interval=5.0,
        )
        try:
            wait_until_shipping(mon)  # steady state: the shipper process's start-up is a one-off
            return self.timed()
        finally:
            mon.close()

    def pairs(self, reps: int, second: Callable[[], float] | None = None) -> list[tuple[float, float]]:
        """(plain, other) per repetition; `other` defaults to an agent block."""
        other = second or self.agent_block
        result = []
        for rep in range(reps):
            if rep % 2 == 0:
                plain = self.plain_block()
                result.append((plain, other()))
            else:
                value = other()
                result.append((self.plain_block(), value))
        return result


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


def calibrate_batch(width: int) -> int:
    """The batch size from a ladder whose median step is closest to TARGET_STEP_MS here."""
    best, best_gap = 16, float("inf")
    for batch in (16, 24, 32, 48, 64, 96, 128, 192, 256):
        model, optimizer, loader = make_loop(width, batch, 8)
        run_block(model, optimizer, loader, 3)
        ms = statistics.median(run_block(model, optimizer, loader, 30)) * 1e3
        if abs(ms - TARGET_STEP_MS) < best_gap:
            best, best_gap = batch, abs(ms - TARGET_STEP_MS)
        if ms > 1.3 * TARGET_STEP_MS:
            break
    return best


def report(
    title: str, pairs: list[tuple[float, float]], control: list[tuple[float, float]] | None = None
) -> float:
    """Print one comparison; returns the median absolute difference in seconds per step."""
    ratios = [b / a for a, b in pairs]
    delta = statistics.median(b - a for a, b in pairs)
    median = statistics.median(ratios)
    print(title)
    print(f"  median step without agent: {statistics.median(a for a, _ in pairs) * 1e3:8.3f} ms")
    print(f"  median step with agent:    {statistics.median(b for _, b in pairs) * 1e3:8.3f} ms")
    print(
        f"  ratio with/without, median of {len(pairs)}: {median:.4f} "
        f"(overhead {100 * (median - 1):+.2f}%), range {min(ratios):.4f} .. {max(ratios):.4f}"
    )
    if control is not None:
        c = [b / a for a, b in control]
        print(
            f"  A/A control (plain vs plain), same protocol: {statistics.median(c):.4f}, "
            f"range {min(c):.4f} .. {max(c):.4f}"
        )
    print(f"  absolute: {delta * 1e6:+.1f} µs per step (median)")
    return delta


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40, help="steps per block in the ~20 ms loop")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=0, help="batch size (default: sized to ~20 ms/step)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    ctx = mp.get_context("spawn")
    port_out, stop = ctx.Queue(), ctx.Event()
    server_process = ctx.Process(target=serve, args=(port_out, stop), daemon=True)
    server_process.start()
    server = f"127.0.0.1:{port_out.get(timeout=30)}"
    try:
        import torch

        print(
            f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
            f"{os.cpu_count()} CPUs; ingest server (separate process) at {server}"
        )
        have_proc = os.path.isdir("/proc/self/task")
        tiny_model, tiny_optimizer, tiny_loader = make_loop(8, 1, 64)
        run_block(tiny_model, tiny_optimizer, tiny_loader, 200)
        background = (
            background_cpu_per_step(tiny_model, tiny_optimizer, tiny_loader, steps=10_000, server=server)
            if have_proc
            else None
        )

        batch = args.batch or calibrate_batch(args.width)
        model, optimizer, loader = make_loop(args.width, batch, 16)
        run_block(model, optimizer, loader, 5)  # warm up
        big = Interleaving(model, optimizer, loader, steps=args.steps, server=server)
        control = big.pairs(args.reps, second=big.plain_block)
        pairs = big.pairs(args.reps)
        report(
            f"1) wall clock: MLP {args.width}x3 + Adam, batch {batch}, {args.steps} steps per block",
            pairs,
            control,
        )
        step_seconds = statistics.median(a for a, _ in pairs)

        tiny = Interleaving(tiny_model, tiny_optimizer, tiny_loader, steps=1000, server=server)
        thread_cost = max(
            0.0, report("2) training-thread cost: tiny model, 1000 steps per block", tiny.pairs(args.reps))
        )

        print("3) agent CPU off the training thread, 10000 tiny steps")
        if background is None:
            print("  n/a (needs /proc)")
            return
        in_process, shipper = background
        print(f"  feeder + NVML threads (training process): {in_process * 1e6:.1f} µs per step")
        print(f"  shipper process (batching, gzip, gRPC):    {shipper * 1e6:.1f} µs per step")
        total = thread_cost + in_process + shipper
        print(
            f"estimate at {step_seconds * 1e3:.1f} ms per step: ({thread_cost * 1e6:.0f} + "
            f"{in_process * 1e6:.0f} + {shipper * 1e6:.0f}) µs = {100 * total / step_seconds:.2f}% of "
            f"one core's time per step (training thread {100 * thread_cost / step_seconds:.2f}%)"
        )
    finally:
        stop.set()
        server_process.join(5)


if __name__ == "__main__":
    main()
