"""A paced fleet on one replica: N simulated agents, each stepping at its own rate and flushing as
the agent's shipper does, against a real `smon server` on a fresh PostgreSQL database (issue 30).

`benchmarks/ingest.py` measures batches of 256 steps sent as fast as Acks allow. A live fleet is
another shape: a rank makes 0.5-5 steps a second and its shipper flushes once a second (or at
`max_batch_records`), so the load is one small batch per rank per second and the server's cost
per batch, not per record, decides how many ranks one replica serves. Each simulated agent here:
- steps at a rate drawn from `--rates` (uniform, 0.5-5 steps/s) and queues one DDP step record
  (five spans) per step;
- keeps the shipper's policy (smon.config.AgentConfig defaults, smon/shipper.py): a batch when
  `flush_interval` has passed since the last one with records (or at `max_batch_records`), a
  heartbeat-only batch when `heartbeat_interval` has passed with nothing to send, at most
  `max_unacked_batches` awaiting their Ack, records held back while an Ack's `throttle_seconds`
  runs, and the flush interval an Ack asks for (`flush_seconds`, smon.shipper.flush_policy);
- sends the agent's wire form: one `Batch` with coordinates, heartbeat, counters and its records
  as one `StepTable`, on its own gRPC channel and stream.
Each N runs for `--duration` seconds (after `--warmup`, whose batches are not counted) on a fresh
server and database. Reported per N: batches and steps acked per second, send->Ack p50 / p99,
refused (rejections), dropped (an agent's queue full) and lost (never acked by the end) records,
streams reopened after an error, CPU per batch of
the server, PostgreSQL's backends and this load generator, and bytes per stored step with every
table included. The largest N with p99 <= 1 s and nothing refused or dropped is printed last.

    .venv/bin/python benchmarks/fleet.py [--agents 500,1000,2000] [--duration 30] [--warmup 5]

Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psycopg
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_db import fresh_database  # noqa: E402
from benchmarks.ingest import backends_of, cpu_seconds  # noqa: E402
from smon.config import AgentConfig  # noqa: E402
from smon.shipper import CHANNEL_OPTIONS, MAX_THROTTLE_SECONDS, backoff_delay, flush_policy  # noqa: E402
from smon.table import to_table  # noqa: E402
from smon.v1 import ingest_pb2 as pb  # noqa: E402
from tests.support import factories as f  # noqa: E402
from tests.support.server_process import free_port, start_server  # noqa: E402

RANKS_PER_JOB = 64
DRAIN_SECONDS = 30.0  # after the run, how long an agent waits for its last Acks (resending)
QUEUE_SIZE = AgentConfig().queue_size


class StepTables:
    """StepTables of k consecutive DDP steps, made from one template with array arithmetic so the
    load generator spends microseconds, not a Python object per span, on each batch."""

    def __init__(self, step: list[pb.StepRecord] | None = None) -> None:
        template = to_table(step if step is not None else f.dp_job_steps(1, [0], origin=0.0)[0])
        self.template = template
        self.spans = template.records and len(np.frombuffer(template.span_kind, "<u2"))
        self.span_offset = np.frombuffer(template.span_start, "<f8")  # from the step's start
        self.step_seconds = float(np.frombuffer(template.duration, "<f8")[0])

    def table(self, first_step: int, starts: np.ndarray) -> pb.StepTable:
        k = len(starts)
        t = self.template
        out = pb.StepTable(records=k, kinds=t.kinds)
        out.step = np.arange(first_step, first_step + k, dtype="<i8").tobytes()
        out.start_time = starts.astype("<f8").tobytes()
        out.end_time = (starts + self.step_seconds).astype("<f8").tobytes()
        out.duration = np.frombuffer(t.duration, "<f8").repeat(k).tobytes()
        out.gc_count = np.frombuffer(t.gc_count, "<u4").repeat(k).tobytes()
        out.gc_seconds = np.frombuffer(t.gc_seconds, "<f8").repeat(k).tobytes()
        out.span_count = np.frombuffer(t.span_count, "<u4").repeat(k).tobytes()
        out.span_kind = np.tile(np.frombuffer(t.span_kind, "<u2"), k).tobytes()
        out.span_start = (np.add.outer(starts, self.span_offset).ravel()).astype("<f8").tobytes()
        out.span_duration = np.tile(np.frombuffer(t.span_duration, "<f8"), k).tobytes()
        return out


@dataclass
class Figures:
    latencies: list[float] = field(default_factory=list)
    batches: int = 0
    steps: int = 0
    refused: int = 0
    dropped: int = 0
    throttled: int = 0
    flush_seconds: list[float] = field(default_factory=list)
    error_codes: collections.Counter[str] = field(default_factory=collections.Counter)
    reconnects: int = 0
    resent: int = 0
    lost: int = 0  # steps in batches never acked by the end
    debug_errors: list[str] = field(default_factory=list)  # the first few, with grpc's own detail

    def acked(self, duration: float, default_flush: float) -> dict[str, Any]:
        """What the fleet got from its Acks over `duration` measured seconds."""
        lat = sorted(self.latencies) or [float("nan")]
        return {
            "batches_s": self.batches / duration,
            "steps_s": self.steps / duration,
            "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "refused": self.refused,
            "dropped": self.dropped,
            "lost": self.lost,
            "reconnects": self.reconnects,
            "flush": statistics.median(self.flush_seconds) if self.flush_seconds else default_flush,
        }


class SimAgent:
    """One rank's shipper, paced: its steps come at `rate`, its batches as the shipper cuts them."""

    def __init__(self, job: str, rank: int, rate: float, tables: StepTables, config: AgentConfig) -> None:
        self.job, self.rank, self.rate = job, rank, rate
        self.agent_id = uuid.uuid4().hex
        self.tables = tables
        self.config = config
        self.coords = f.coords(job, rank, RANKS_PER_JOB, host=f"host-{rank // 8}")
        self.seq = 0
        self.sent_steps = 0  # steps taken into batches so far
        self.flush_seconds = 0.0  # what the server's Acks ask for (0: the config's)
        self.hold_until = 0.0

    def steps_made(self, elapsed: float) -> int:
        return int(elapsed * self.rate)

    def batch(self, now: float, origin: float, upto: int, dropped: int) -> bytes:
        self.seq += 1
        k = upto - self.sent_steps
        b = pb.Batch(
            agent_id=self.agent_id,
            seq=self.seq,
            coords=self.coords,
            heartbeat=pb.Heartbeat(time=now, last_step=upto - 1, current_step=upto),
            counters=pb.AgentCounters(dropped_records=dropped),
            sent_time=now,
        )
        if k:
            b.step_table.CopyFrom(self.step_table(origin, upto))
        self.sent_steps = upto
        return b.SerializeToString()

    def step_table(self, origin: float, upto: int) -> pb.StepTable:
        """The steps from the last sent one up to `upto` (exclusive)."""
        return self.tables.table(self.sent_steps, self.starts(origin, upto))

    def starts(self, origin: float, upto: int) -> np.ndarray:
        """Start times of the steps from the last sent one up to `upto`: step k at origin + k / rate."""
        return origin + np.arange(self.sent_steps, upto) / self.rate

    async def run(
        self, channel: grpc.aio.Channel, start: float, stop: float, measure_from: float, figures: Figures
    ) -> None:
        """Steps, batches and Acks until `stop`, then up to DRAIN_SECONDS to have every batch acked. A
        stream that fails is opened again after the shipper's backoff, and the unacked batches
        are resent first (the server stores each once), as smon/shipper.py does."""
        cfg = self.config
        origin = time.time()
        t0 = time.perf_counter()
        unacked: dict[int, tuple[bytes, float, int]] = {}  # seq -> (payload, first sent, steps)

        def on_ack(ack: pb.Ack) -> None:
            self.flush_seconds = ack.flush_seconds
            entry = unacked.pop(ack.seq, None)  # seq 0: the server's word as the stream opens
            if entry is None:
                return
            _, at, steps = entry
            if at >= measure_from:
                figures.latencies.append(time.perf_counter() - at)
                figures.batches += 1
                figures.steps += steps
                figures.refused += ack.rejected
            if ack.throttle_seconds > 0:
                figures.throttled += 1
                hold = min(ack.throttle_seconds, MAX_THROTTLE_SECONDS)
                self.hold_until = max(self.hold_until, time.perf_counter() + hold)

        async def read_acks(call: Any) -> None:
            try:
                async for ack in call:
                    on_ack(ack)
            except grpc.RpcError as exc:
                late = time.perf_counter() - stop
                early = 5 * int(-late // 5)
                when = "after the end" if late > 0 else f"{early}-{early + 5} s before the end"
                figures.error_codes[f"{exc.code()}: {exc.details()} ({when})"] += 1
                if len(figures.debug_errors) < 5:
                    since = time.perf_counter() - start
                    figures.debug_errors.append(f"{since:.1f} s after the start: {exc.debug_error_string()}")

        method = channel.stream_stream(
            "/smon.v1.Ingest/Stream", request_serializer=None, response_deserializer=pb.Ack.FromString
        )
        call: Any = None
        failures = 0

        async def open_stream() -> asyncio.Task[None]:
            nonlocal call, failures
            if call is not None:
                figures.reconnects += 1
                failures += 1
                await asyncio.sleep(backoff_delay(failures, cfg.backoff_base, cfg.backoff_cap))
            call = method()
            reader = asyncio.create_task(read_acks(call))
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                for payload, _, _ in list(unacked.values()):
                    figures.resent += 1
                    await call.write(payload)
            return reader

        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        reader = await open_stream()
        last_sent = last_records = time.perf_counter()
        dropped = 0
        while (now := time.perf_counter()) < stop:
            if reader.done():
                reader = await open_stream()
                continue
            flush, heartbeat = flush_policy(cfg, self.flush_seconds)
            made = self.steps_made(now - t0)
            queued = made - self.sent_steps
            if queued > QUEUE_SIZE:  # the bounded queue drops its oldest
                dropped += queued - QUEUE_SIZE
                self.sent_steps = made - QUEUE_SIZE
                queued = QUEUE_SIZE
            held = now < self.hold_until
            due = queued and not held and (queued >= cfg.max_batch_records or now - last_records >= flush)
            if due or now - last_sent >= heartbeat:
                if len(unacked) >= cfg.max_unacked_batches:
                    await asyncio.sleep(0.05)
                    continue
                upto = min(made, self.sent_steps + cfg.max_batch_records) if due else self.sent_steps
                steps = upto - self.sent_steps
                payload = self.batch(time.time(), origin, upto, dropped)
                unacked[self.seq] = (payload, now, steps)
                with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                    await call.write(payload)  # a failed stream is noticed by its reader
                last_sent = now
                if due:
                    last_records = now
                continue
            wake = min(last_sent + heartbeat, (last_records + flush) if queued else float("inf"))
            if queued and held:
                wake = min(wake, self.hold_until)
            if not queued:
                wake = min(wake, t0 + (self.sent_steps + 1) / self.rate)
            await asyncio.sleep(max(0.001, min(wake, stop, now + 0.5) - time.perf_counter()))
        deadline = time.perf_counter() + DRAIN_SECONDS
        while unacked and time.perf_counter() < deadline:
            if reader.done():
                reader = await open_stream()
            await asyncio.sleep(0.05)
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await call.done_writing()
        figures.lost += sum(n for _, _, n in unacked.values())
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        if self.flush_seconds:
            figures.flush_seconds.append(self.flush_seconds)
        figures.dropped += dropped


def open_channels(target: str | Sequence[str], count: int) -> list[grpc.aio.Channel]:
    """`count` connections, spread round-robin over the replicas in `target` (a load balancer's
    way: each connection stays with the replica it reached)."""
    targets = [target] if isinstance(target, str) else list(target)
    return [
        grpc.aio.insecure_channel(targets[i % len(targets)], options=CHANNEL_OPTIONS) for i in range(count)
    ]


async def fleet(
    target: str | Sequence[str], agents: list[SimAgent], duration: float, warmup: float, per_channel: int
) -> Figures:
    """All agents at once, starts spread over one flush interval as a fleet's ranks are; each
    `per_channel` agents share a channel (a connection), each agent its own stream."""
    figures = Figures()
    start = time.perf_counter() + 1.0
    stop = start + warmup + duration
    spread = agents[0].config.flush_interval if agents else 1.0
    channels = open_channels(target, len(range(0, len(agents), per_channel)))
    try:
        await asyncio.gather(
            *(
                a.run(
                    channels[i // per_channel],
                    start + spread * i / len(agents),
                    stop,
                    start + warmup,
                    figures,
                )
                for i, a in enumerate(agents)
            )
        )
    finally:
        for channel in channels:
            await channel.close()
    return figures


class SimRelay:
    """One host's relay (smon/relay.py), paced: each flush interval it takes one batch from each of
    its ranks (their records since the last, else a heartbeat) and forwards them, serialized as the
    ranks cut them, as the parts of one `HostBatch` on its own `Ingest.StreamHost` stream; a
    HostAck settles them all. Unacked HostBatches are resent after a reconnect (the server stores
    each part once), the HostAck's `throttle_seconds` / `flush_seconds` apply to the whole host.
    The send->Ack time is measured from the HostBatch's send (a rank's batch waits up to one more
    flush interval at a real relay before it leaves)."""

    def __init__(self, agents: list[SimAgent]) -> None:
        self.agents = agents
        self.config = agents[0].config
        self.seq = 0
        self.flush_seconds = 0.0
        self.hold_until = 0.0

    def bundle(self, now: float, t0: float, origin: float, dropped: list[int]) -> tuple[bytes, int]:
        parts, steps = [], 0
        for i, agent in enumerate(self.agents):
            made = agent.steps_made(now - t0)
            queued = made - agent.sent_steps
            if queued > QUEUE_SIZE:
                dropped[i] += queued - QUEUE_SIZE
                agent.sent_steps = made - QUEUE_SIZE
            upto = min(made, agent.sent_steps + self.config.max_batch_records)
            steps += upto - agent.sent_steps
            parts.append(agent.batch(time.time(), origin, upto, dropped[i]))
        self.seq += 1
        return pb.HostBatch(seq=self.seq, parts=parts).SerializeToString(), steps

    async def run(
        self, channel: grpc.aio.Channel, start: float, stop: float, measure_from: float, figures: Figures
    ) -> None:
        cfg = self.config
        origin = time.time()
        t0 = time.perf_counter()
        unacked: dict[int, tuple[bytes, float, int]] = {}  # host seq -> (payload, first sent, steps)
        dropped = [0] * len(self.agents)

        def on_ack(ack: pb.HostAck) -> None:
            self.flush_seconds = ack.flush_seconds
            if ack.throttle_seconds > 0:
                figures.throttled += 1
                hold = min(ack.throttle_seconds, MAX_THROTTLE_SECONDS)
                self.hold_until = max(self.hold_until, time.perf_counter() + hold)
            entry = unacked.pop(ack.seq, None)  # seq 0: the server's word as the stream opens
            if entry is None:
                return
            _, at, steps = entry
            if at >= measure_from:
                figures.latencies.append(time.perf_counter() - at)
                figures.batches += len(ack.acks)
                figures.steps += steps
                figures.refused += sum(a.rejected for a in ack.acks)

        async def read_acks(call: Any) -> None:
            try:
                async for ack in call:
                    on_ack(ack)
            except grpc.RpcError as exc:
                late = time.perf_counter() - stop
                early = 5 * int(-late // 5)
                when = "after the end" if late > 0 else f"{early}-{early + 5} s before the end"
                figures.error_codes[f"{exc.code()}: {exc.details()} ({when})"] += 1

        method = channel.stream_stream(
            "/smon.v1.Ingest/StreamHost", request_serializer=None, response_deserializer=pb.HostAck.FromString
        )
        call: Any = None
        failures = 0

        async def open_stream() -> asyncio.Task[None]:
            nonlocal call, failures
            if call is not None:
                figures.reconnects += 1
                failures += 1
                await asyncio.sleep(backoff_delay(failures, cfg.backoff_base, cfg.backoff_cap))
            call = method()
            reader = asyncio.create_task(read_acks(call))
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                for payload, _, _ in list(unacked.values()):
                    figures.resent += 1
                    await call.write(payload)
            return reader

        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        reader = await open_stream()
        last = time.perf_counter()
        while (now := time.perf_counter()) < stop:
            if reader.done():
                reader = await open_stream()
                continue
            flush, _ = flush_policy(cfg, self.flush_seconds)
            wake = max(last + flush, self.hold_until)
            if now < wake:
                await asyncio.sleep(max(0.001, min(wake, stop) - now))
                continue
            if len(unacked) >= 8:  # smon.relay.MAX_IN_FLIGHT
                await asyncio.sleep(0.05)
                continue
            payload, steps = self.bundle(now, t0, origin, dropped)
            unacked[self.seq] = (payload, now, steps)
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await call.write(payload)
            last = now
        deadline = time.perf_counter() + DRAIN_SECONDS
        while unacked and time.perf_counter() < deadline:
            if reader.done():
                reader = await open_stream()
            await asyncio.sleep(0.05)
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await call.done_writing()
        figures.lost += sum(n for _, _, n in unacked.values())
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        if self.flush_seconds:
            figures.flush_seconds.append(self.flush_seconds)
        figures.dropped += sum(dropped)


async def relayed_fleet(
    target: str | Sequence[str],
    agents: list[SimAgent],
    duration: float,
    warmup: float,
    ranks_per_host: int,
    per_channel: int,
) -> Figures:
    """The fleet as hosts of `ranks_per_host` ranks, each host one relay stream, `per_channel`
    relays a channel (1: a connection each, as hosts); hosts start spread over one flush interval."""
    figures = Figures()
    start = time.perf_counter() + 1.0
    stop = start + warmup + duration
    spread = agents[0].config.flush_interval if agents else 1.0
    relays = [SimRelay(agents[i : i + ranks_per_host]) for i in range(0, len(agents), ranks_per_host)]
    for relay in relays:
        for agent in relay.agents:
            agent.coords.host = f"host-{relay.agents[0].rank // ranks_per_host}"
    channels = open_channels(target, len(range(0, len(relays), per_channel)))
    try:
        await asyncio.gather(
            *(
                r.run(
                    channels[i // per_channel],
                    start + spread * i / len(relays),
                    stop,
                    start + warmup,
                    figures,
                )
                for i, r in enumerate(relays)
            )
        )
    finally:
        for channel in channels:
            await channel.close()
    return figures


def stored_bytes(conninfo: str) -> tuple[int, int, dict[str, int]]:
    """(bytes of every table of the schema, indexes and TOAST included; steps stored; by table)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname <> 'alembic_version'"
        ).fetchall()
        steps = conn.execute("SELECT count(*) FROM step_records").fetchone()
    by_table = {str(name): int(size) for name, size in rows}
    return sum(by_table.values()), int(steps[0]) if steps else 0, by_table


def one_level(n: int, args: argparse.Namespace, config: AgentConfig) -> dict[str, Any]:
    rng = random.Random(n)
    tables = StepTables()
    with fresh_database("smon_bench_fleet") as database_url:
        url = make_url(database_url)
        http, grpc_port = free_port(), free_port()
        env = {"SMON_ANALYSIS_INTERVAL": "3600", **dict(kv.split("=", 1) for kv in args.env)}
        log = Path(args.server_log) if args.server_log else None
        server = start_server(database_url, http, grpc_port, env, log_path=log)
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            agents = [
                SimAgent(
                    f"fleet-{a // RANKS_PER_JOB}", a % RANKS_PER_JOB, rng.uniform(*args.rates), tables, config
                )
                for a in range(n)
            ]
            database = url.database or ""
            before = {
                "server": cpu_seconds([server.pid]),
                "client": time.process_time(),
                "backends": cpu_seconds(backends_of(database)),
            }
            seen = set(backends_of(database))
            started = time.perf_counter()
            target = f"127.0.0.1:{grpc_port}"
            if args.ranks_per_host > 1:
                figures = asyncio.run(
                    relayed_fleet(
                        target, agents, args.duration, args.warmup, args.ranks_per_host, args.per_channel
                    )
                )
            else:
                figures = asyncio.run(fleet(target, agents, args.duration, args.warmup, args.per_channel))
            wall = time.perf_counter() - started
            seen |= set(backends_of(database))
            cpu = {
                "server": cpu_seconds([server.pid]) - before["server"],
                "client": time.process_time() - before["client"],
                "backends": cpu_seconds(sorted(seen)) - before["backends"],
            }
            time.sleep(1.0)
            size, stored, by_table = stored_bytes(conninfo)
        finally:
            server.kill()
            server.wait(10)
    if figures.error_codes:
        print(
            f"  streams ended by errors (then reopened, unacked batches resent): "
            f"{dict(figures.error_codes)}; {figures.resent} batches resent"
        )
        for line in figures.debug_errors:
            print(f"    {line}")
    all_batches = max(1, sum(a.seq for a in agents))
    out = {
        "agents": n,
        **figures.acked(args.duration, config.flush_interval),
        "throttled": figures.throttled,
        "cpu_server": cpu["server"] / all_batches * 1e6,
        "cpu_server_step": cpu["server"] / max(1, sum(a.sent_steps for a in agents)) * 1e6,
        "cpu_pg": cpu["backends"] / all_batches * 1e6,
        "cpu_client": cpu["client"] / all_batches * 1e6,
        "cores_server": cpu["server"] / wall,
        "cores_pg": cpu["backends"] / wall,
        "cores_client": cpu["client"] / wall,
        "bytes_step": size / max(stored, 1),
        "ledger_step": by_table.get("ingested_batches", 0) / max(stored, 1),
        "pruned_step": (size - by_table.get("ingested_batches", 0)) / max(stored, 1),
        "tables": {k: v / max(stored, 1) for k, v in sorted(by_table.items(), key=lambda kv: -kv[1])[:6]},
        "stored": stored,
        "sent_steps": sum(a.sent_steps for a in agents),
        "load": os.getloadavg()[0],
    }
    out["ok"] = float(out["p99"] <= 1.0 and not figures.refused and not figures.dropped and not figures.lost)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", default="500,1000,2000", help="fleet sizes, comma-separated")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds measured per fleet size")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--rates", type=float, nargs=2, default=(0.5, 5.0), help="steps/s, uniform")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    parser.add_argument(
        "--per-channel",
        type=int,
        default=1,
        help="agents (with --ranks-per-host: relays) sharing one channel (1: a connection each, as ranks)",
    )
    parser.add_argument(
        "--ranks-per-host",
        default="1",
        help="comma-separated K: 1, each agent its own stream; K > 1, hosts of K ranks, each host's "
        "batches on one relay stream (Ingest.StreamHost, smon/relay.py)",
    )
    parser.add_argument("--server-log", default="", help="keep the server's output in this file")
    parser.add_argument("--stop-after-fail", action="store_true", help="stop at the first size that fails")
    args = parser.parse_args()
    config = AgentConfig()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    print(
        f"commit {commit.stdout.strip()}, load {os.getloadavg()}, flush {config.flush_interval} s, "
        f"heartbeat {config.heartbeat_interval} s, rates {args.rates[0]}-{args.rates[1]} steps/s, "
        f"{args.duration:.0f} s per size, {args.per_channel} agent(s) a connection"
    )
    print(
        f"{'agents':>7} {'batch/s':>8} {'steps/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'refused':>7} "
        f"{'dropped':>7} {'lost':>5} {'recon':>5} {'flush s':>7} "
        f"{'srv us/b':>8} {'pg us/b':>8} {'gen us/b':>8} "
        f"{'srv cores':>9} {'pg cores':>8} {'gen cores':>9} {'B/step':>7} {'ledger':>6} {'load':>5}"
    )
    best = 0
    hosts = [int(k) for k in str(args.ranks_per_host).split(",")]
    for n, k in ((int(x), k) for x in args.agents.split(",") for k in hosts):
        args.ranks_per_host = k
        r = one_level(n, args, config)
        if len(hosts) > 1 or k > 1:
            print(
                f"  {k} rank(s) a host ({'relay streams' if k > 1 else 'direct streams'}): server "
                f"{r['cpu_server_step']:.0f} us CPU per step sent, {r['cores_server']:.2f} cores, "
                f"load {r['load']:.1f}"
            )
        print(
            f"{n:>7} {r['batches_s']:>8,.0f} {r['steps_s']:>8,.0f} {r['p50'] * 1000:>7.0f} "
            f"{r['p99'] * 1000:>7.0f} {r['refused']:>7.0f} {r['dropped']:>7.0f} "
            f"{r['lost']:>5.0f} {r['reconnects']:>5.0f} "
            f"{r['flush']:>7.2f} {r['cpu_server']:>8.0f} {r['cpu_pg']:>8.0f} {r['cpu_client']:>8.0f} "
            f"{r['cores_server']:>9.2f} {r['cores_pg']:>8.2f} {r['cores_client']:>9.2f} "
            f"{r['bytes_step']:>7.0f} {r['ledger_step']:>6.0f} {r['load']:>5.1f}",
            flush=True,
        )
        tables = ", ".join(f"{k} {v:.0f}" for k, v in r["tables"].items())
        print(
            f"  bytes/step {r['bytes_step']:.0f} as ingested, {r['pruned_step']:.0f} once the dedup "
            "ledger is pruned (it keeps SMON_INGEST_LEDGER_SECONDS of batches, not the retention's); "
            f"by table: {tables}"
        )
        if r["ok"]:
            best = max(best, n)
        elif args.stop_after_fail:
            break
    print(f"largest fleet sustained (p99 send->Ack <= 1 s, nothing refused or dropped): {best} agents")


if __name__ == "__main__":
    main()
