"""The gRPC ingest fuzzed with hypothesis over real gRPC, against `smon server` in its own process
(SQLite, the embedded default, and PostgreSQL): random bytes, batches generated in both wire forms
(StepRecord messages and the columnar StepTable), and valid batches with some records, the table
or the batch itself broken.

Whatever arrives, the server answers with an Ack or a clear INVALID_ARGUMENT (bytes that are no
smon.v1.Batch), never INTERNAL / UNKNOWN / UNAVAILABLE (which an agent would resend forever). Every
refusal names its reason and is counted on /metrics (`smon_ingest_rejected_total{reason}`), the
valid records beside bad ones are stored (the test counts them in the database), the database
never refuses what validation let through (`storage_refused` never happens), and the server is
healthy afterwards. No client can exhaust what others need: a batch naming thousands of phases
costs only its own job (the names past its limit are folded into its `other`), and after the
fuzz a new job's own phase names all get codes. Memory stays bounded: the server's peak RSS, and
(on PostgreSQL, whose leases keep a pass here apart from the server's own) one analysis pass over
every fuzzed job, which must analyse each (none marked failed) within a bounded peak.

Runs derandomised (the same inputs every run) with a few dozen inputs per test in CI; longer and
new with SMON_FUZZ_EXAMPLES / SMON_FUZZ_SEED (tests/support/fuzzing.py). The inputs tried are printed.
"""

from __future__ import annotations

import math
import subprocess
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import Engine

from smon.table import to_table
from smon.v1 import ingest_pb2 as pb
from smon_server.context import ServerContext
from smon_server.jobs.loop import analysis_pass
from smon_server.store import codec
from smon_server.store.kinds import DEFAULT_MAX_PHASE_NAMES, STANDARD_KINDS
from smon_server.store.models import AnalysisResult, Job
from smon_server.store.replicas import Membership
from tests.ingest.wire_cases import MESSAGE_CASES, RECORD_CASES
from tests.support import factories as f
from tests.support.databases import fresh_database
from tests.support.fuzzing import fuzz
from tests.support.server_process import free_port, start_server
from tests.support.settings import server_settings

pytestmark = [pytest.mark.slow, pytest.mark.parallel]  # answers and counts: no timing

# The status codes an answer may end with other than OK: the bytes are no Batch (INVALID_ARGUMENT),
# or the message is past the server's size limit (RESOURCE_EXHAUSTED, grpc's own).
CLEAR_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ = fuzz(60)
# The server's peak resident memory after the whole module (a few hundred MB in practice).
MAX_SERVER_RSS = 1 << 30
# One analysis pass over every fuzzed job (each a handful of records; tens of MB in practice).
MAX_PASS_BYTES = 256 << 20
KINDS = ["data_wait", "forward", "backward", "grad_sync", "optimizer", "checkpoint"]
U32, U64 = 2**32 - 1, 2**64 - 1


@dataclass
class Server:
    grpc_target: str
    http: str
    engine: Engine
    process: subprocess.Popen[bytes]
    push: Callable[..., pb.Ack] = field(init=False)
    channel: grpc.Channel = field(init=False)
    tried: Counter[str] = field(default_factory=Counter)  # inputs sent, by strategy
    refused: Counter[str] = field(default_factory=Counter)  # refusals answered, by reason

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(
            self.grpc_target, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        )
        # Raw bytes in, so a test can send what no Batch serialises to.
        self.push = self.channel.unary_unary(
            "/smon.v1.Ingest/Push", request_serializer=None, response_deserializer=pb.Ack.FromString
        )

    def send(self, payload: bytes, strategy: str) -> pb.Ack | None:
        """Push `payload`; the Ack, or None after a clear refusal. Anything else fails the test."""
        self.tried[strategy] += 1
        assert self.process.poll() is None, "the server died"
        try:
            ack: pb.Ack = self.push(payload, timeout=60)
        except grpc.RpcError as exc:
            code = exc.code()
            assert code in CLEAR_CODES, f"{code}: {exc.details()}"
            assert exc.details(), "a refusal without a reason"
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                self.refused["malformed"] += 1
            return None
        if not ack.duplicate:  # a resend is counted once, when it was first stored
            for rejection in ack.rejections:
                assert rejection.reason and rejection.detail, rejection
                self.refused[rejection.reason] += 1
        assert "storage_refused" not in {r.reason for r in ack.rejections}, ack
        return ack

    def stored_steps(self, job: str) -> list[int]:
        with self.engine.connect() as c:
            rows = c.execute(
                text(
                    "SELECT r.step FROM step_records r JOIN jobs j ON j.key = r.job_key "
                    "WHERE j.job_id = :job ORDER BY r.step"
                ),
                {"job": job},
            )
            return [int(step) for (step,) in rows]

    def phase_names(self, job: str) -> set[str]:
        with self.engine.connect() as c:
            rows = c.execute(
                text(
                    "SELECT k.name FROM job_span_kinds k JOIN jobs j ON j.key = k.job_key"
                    " WHERE j.job_id = :job"
                ),
                {"job": job},
            )
            return {str(name) for (name,) in rows}

    def largest_dictionary(self) -> int:
        with self.engine.connect() as c:
            sql = (
                "SELECT coalesce(max(n), 0) FROM"
                " (SELECT count(*) AS n FROM job_span_kinds GROUP BY job_key) t"
            )
            return int(c.execute(text(sql)).scalar_one())

    def rejected_counters(self) -> dict[str, float]:
        body = httpx.get(f"{self.http}/metrics", timeout=30).text
        return {
            s.labels["reason"]: s.value
            for family in text_string_to_metric_families(body)
            if family.name == "smon_ingest_rejected"
            for s in family.samples
            if s.name == "smon_ingest_rejected_total"
        }


def _run_server(url: str) -> Iterator[Server]:
    http, port = free_port(), free_port()
    # No analysis passes: the fuzz is about ingest, and the machine is small.
    process = start_server(url, http, port, env={"SMON_ANALYSIS_INTERVAL": "3600"})
    engine = create_engine(url)
    server = Server(f"127.0.0.1:{port}", f"http://127.0.0.1:{http}", engine, process)
    try:
        yield server
    finally:
        server.channel.close()
        engine.dispose()
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fuzz_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if request.param == "sqlite":
        path: Path = tmp_path_factory.mktemp("fuzz") / "smon.db"
        yield from _run_server(f"sqlite:///{path}")
        return
    admin = request.getfixturevalue("postgres_admin_url")
    with fresh_database(admin, "smon_fuzz") as url:
        yield from _run_server(url)


@pytest.fixture(scope="module")
def counted(fuzz_server: Server) -> Iterator[Server]:
    """After all the module's inputs: each refusal counted on /metrics once, and the server healthy."""
    before = fuzz_server.rejected_counters()
    yield fuzz_server
    after = fuzz_server.rejected_counters()
    served = {r: after.get(r, 0) - before.get(r, 0) for r in after}
    assert {r: n for r, n in served.items() if n} == dict(fuzz_server.refused)
    assert "storage_refused" not in served or served["storage_refused"] == 0
    assert httpx.get(f"{fuzz_server.http}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{fuzz_server.http}/readyz", timeout=10).status_code == 200
    # Nothing one client sent is used up for the next: a new job's own phase names all get codes,
    # and no job holds more names than its limit.
    job = f.new_job_id("after-fuzz")
    step = f.dp_step(1, start=f.T0)
    step.spans.add(kind="compute", start=f.T0 + 0.003, duration=0.001)
    ack = fuzz_server.send(f.batch(job, 0, 1, steps=[step]).SerializeToString(), "health")
    assert ack is not None and ack.accepted == 1
    assert fuzz_server.phase_names(job) >= {"compute", "forward", "backward"}
    assert fuzz_server.largest_dictionary() <= DEFAULT_MAX_PHASE_NAMES + len(STANDARD_KINDS)
    rss = _peak_rss(fuzz_server.process.pid)
    assert rss < MAX_SERVER_RSS, f"server peak RSS {rss / 1e6:.0f} MB"
    analysed = ""
    if fuzz_server.engine.dialect.name == "postgresql":
        jobs, peak = _analyse_everything(fuzz_server.engine.url.render_as_string(hide_password=False))
        analysed = f"; one analysis pass over {jobs} jobs, peak {peak / 1e6:.0f} MB"
    print(f"\nserver peak RSS {rss / 1e6:.0f} MB{analysed}")
    print(
        f"\ngRPC fuzz: {sum(fuzz_server.tried.values())} inputs "
        f"({dict(fuzz_server.tried)}); refusals {dict(fuzz_server.refused)}"
    )


def _peak_rss(pid: int) -> int:
    """A process's peak resident memory, bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


class _Alone(Membership):
    def live(self) -> list[int]:
        return [self.key]


def _analyse_everything(url: str) -> tuple[int, int]:
    """One analysis pass over every stored (fuzzed) job, in this process: each must be analysed
    (no job marked failed), within MAX_PASS_BYTES at the peak. Returns (jobs, peak bytes)."""
    context = ServerContext.from_settings(server_settings(url))
    # The fuzzed server's own loop is a replica too: this pass is to cover every job, alone.
    context.membership = _Alone(context.db.engine)
    try:
        tracemalloc.start()
        try:
            analysis_pass(context, time.time())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        with context.db.session() as session:
            results = session.execute(select(AnalysisResult.job_id, AnalysisResult.error)).all()
            jobs = session.scalar(select(func.count()).select_from(Job))
    finally:
        context.close()
    failed = {job: error for job, error in results if error}
    assert not failed, failed
    assert len(results) == jobs
    assert peak < MAX_PASS_BYTES, f"{peak / 1e6:.0f} MB"
    return len(results), peak


# -- strategies ------------------------------------------------------------------------------------
names = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), min_size=1, max_size=20
)
seconds = st.floats(0.0, 50.0, allow_nan=False)


@st.composite
def spans(draw: st.DrawFn, start: float) -> list[pb.Span]:
    out = []
    for _ in range(draw(st.integers(1, 5))):
        span = pb.Span(
            kind=draw(st.sampled_from(KINDS) | names),
            start=start + draw(seconds),
            duration=draw(seconds),
            chunk=draw(st.integers(0, codec.MAX_CHUNK)),
        )
        if draw(st.booleans()):
            span.microbatch = draw(st.integers(-1, 32_767))
        out.append(span)
    return out


def sequence_stats(draw: st.DrawFn) -> pb.SequenceStats:
    return pb.SequenceStats(
        count=draw(st.integers(0, U32)),
        tokens=draw(st.integers(0, U64)),
        sum_sq=draw(st.floats(0, 1e300)),
        max_len=draw(st.integers(0, U32)),
    )


@st.composite
def record(draw: st.DrawFn, step: int) -> pb.StepRecord:
    """A valid step record with every field drawn from its whole valid range."""
    start = f.T0 + draw(st.floats(-1e8, 1e8))
    duration = draw(st.floats(0.0, 86_400.0))
    r = pb.StepRecord(
        step=step,
        start_time=start,
        end_time=start + duration,
        duration=duration,
        spans=draw(spans(start)),
        gc_count=draw(st.integers(0, U32)),
        gc_seconds=draw(st.floats(0.0, 86_400.0)),
    )
    if draw(st.booleans()):
        r.seq.CopyFrom(sequence_stats(draw))
    for _ in range(draw(st.integers(0, 2))):
        r.microbatch_seq.add(microbatch=draw(st.integers(-32_768, 32_767))).seq.CopyFrom(sequence_stats(draw))
    return r


# Each breaks one record for sure (validate.py's checks): the table both wire forms are tested
# against (tests/ingest/wire_cases.py), and the message form's own.
RECORD_BREAKAGES: dict[str, Callable[[pb.StepRecord], object]] = {
    name: case.breaks for name, case in RECORD_CASES.items() if name != "too_many_spans"
}
MESSAGE_BREAKAGES: dict[str, Callable[[pb.StepRecord], object]] = {
    name: case.breaks for name, case in MESSAGE_CASES.items()
}


def _truncate(t: pb.StepTable) -> None:
    t.duration = t.duration[:-3]


def _seq_companion_missing(t: pb.StepTable) -> None:
    t.seq_count = b"\x01\x00\x00\x00" * t.records
    t.ClearField("seq_tokens")


# Each makes the whole table unusable: it is refused with one rejection, the messages beside it kept.
TABLE_BREAKAGES: dict[str, Callable[[pb.StepTable], None]] = {
    "column_short": _truncate,
    "records_one_more": lambda t: setattr(t, "records", t.records + 1),
    "records_huge": lambda t: setattr(t, "records", U32),
    "records_many": lambda t: setattr(t, "records", 15_000),
    "kind_past_list": lambda t: setattr(t, "span_kind", b"\xff\x7f" * (len(t.span_kind) // 2)),
    "span_count_huge": lambda t: setattr(t, "span_count", b"\xff\xff\xff\xff" * t.records),
    "seq_companion_missing": _seq_companion_missing,
    "mb_rows_huge": lambda t: setattr(t, "mb_rows", b"\xff\xff\xff\x7f" * t.records),
    "microbatch_column_odd": lambda t: setattr(t, "span_microbatch", b"\x01\x02\x03"),
}  # fmt: skip


def _world(b: pb.Batch, size: int) -> None:
    b.coords.world_size = size


# Each refuses the batch as a whole, with a reason, nothing of it stored.
BATCH_BREAKAGES: dict[str, Callable[[pb.Batch], None]] = {
    "rank_past_world": lambda b: setattr(b.coords, "rank", b.coords.world_size),
    "negative_rank": lambda b: setattr(b.coords, "rank", -1),
    "zero_world": lambda b: _world(b, 0),
    "dp_past_world": lambda b: setattr(b.coords, "dp_rank", 2**31 - 1),
    "pp_past_world": lambda b: setattr(b.coords, "pp_rank", b.coords.world_size),
    "tp_past_world": lambda b: setattr(b.coords, "tp_rank", b.coords.world_size + 5),
    "negative_pp": lambda b: setattr(b.coords, "pp_rank", -3),
    "dp_size_past_world": lambda b: setattr(b.coords, "dp_size", 2**31 - 1),
    "negative_tp_size": lambda b: setattr(b.coords, "tp_size", -1),
    "world_absurd": lambda b: _world(b, 2**31 - 1),
    "nul_host": lambda b: setattr(b.coords, "host", "node\x001"),
    "long_host": lambda b: setattr(b.coords, "host", "h" * 300),
    "nul_backend": lambda b: setattr(b.coords, "backend", "gl\x00o"),
    "long_version": lambda b: setattr(b.coords, "agent_version", "v" * 65),
    "nul_gpu_uuid": lambda b: setattr(b.coords, "gpu_uuid", "GPU-\x00"),
    "nul_job": lambda b: setattr(b.coords, "job", b.coords.job + "\x00"),
    "empty_job": lambda b: setattr(b.coords, "job", ""),
    "long_job": lambda b: setattr(b.coords, "job", "j" * 257),
    "empty_agent": lambda b: setattr(b, "agent_id", ""),
    "long_agent": lambda b: setattr(b, "agent_id", "a" * 65),
    "nul_agent": lambda b: setattr(b, "agent_id", "a\x00"),
    "seq_zero": lambda b: setattr(b, "seq", 0),
    "nan_offset": lambda b: setattr(b, "clock_offset", math.nan),
    "huge_offset": lambda b: setattr(b, "clock_offset", 1e12),
}


# Batch fields that must not stop the records from being stored: accepted as sent, clamped, or
# refused on their own, but never a reason for the database to refuse the batch.
def _huge_counters(b: pb.Batch) -> None:
    b.counters.CopyFrom(pb.AgentCounters(dropped_records=U64, errors=U64, queued=U64, resent_batches=U64))


def _odd_heartbeat(b: pb.Batch) -> None:
    hb = pb.Heartbeat(time=f.T0, last_step=-(2**63), current_step=2**63 - 1, phase="x\x00" * 100)
    b.heartbeat.CopyFrom(hb)


def _odd_heartbeat_times(b: pb.Batch) -> None:
    b.heartbeat.CopyFrom(pb.Heartbeat(time=math.inf, phase_since=math.nan, phase="p" * 300))


def _heartbeat_since(b: pb.Batch) -> None:
    b.heartbeat.CopyFrom(pb.Heartbeat(time=f.T0, phase="forward", phase_since=math.nan))


def _huge_gpu(b: pb.Batch) -> None:
    b.gpu_samples.add(
        time=f.T0,
        gpu_index=U32,
        gpu_uuid="GPU-1",
        throttle_reasons=U64,
        ecc_corrected=U64,
        ecc_uncorrected=2**63,
        pcie_replay=U64,
        xid_events=[U64, 0],
        sm_clock_mhz=1e308,
    )


def _gpu_same_time(b: pb.Batch) -> None:
    for _ in range(3):
        b.gpu_samples.add(time=f.T0, gpu_index=0, power_w=100.0)


def _gpu_bad(b: pb.Batch) -> None:
    b.gpu_samples.add(time=math.nan, gpu_index=0)
    b.gpu_samples.add(time=f.T0, gpu_index=1, gpu_uuid="\x00")
    b.gpu_samples.add(time=f.T0, gpu_index=2, power_w=-5.0)


def _attempt_extremes(b: pb.Batch) -> None:
    b.coords.attempt = -(2**63)


def _pid_and_local(b: pb.Batch) -> None:
    b.coords.pid = -(2**31)
    b.coords.local_rank = 2**31 - 1


def _unknown_field(b: pb.Batch) -> None:
    b.MergeFromString(b"\xa8\x1f\x01")  # field 500, varint: a newer agent's field


SIDE_FIELDS: dict[str, Callable[[pb.Batch], None]] = {
    "huge_counters": _huge_counters,
    "odd_heartbeat": _odd_heartbeat,
    "odd_heartbeat_times": _odd_heartbeat_times,
    "heartbeat_since_nan": _heartbeat_since,
    "huge_gpu": _huge_gpu,
    "gpu_same_time": _gpu_same_time,
    "gpu_bad": _gpu_bad,
    "attempt_extremes": _attempt_extremes,
    "pid_and_local": _pid_and_local,
    "unknown_field": _unknown_field,
    "final": lambda b: setattr(b, "final", True),
    "long_backend": lambda b: setattr(b.coords, "backend", "b" * 100),  # cut to its column
}


@dataclass
class Case:
    batch: pb.Batch
    good_steps: list[int]  # steps that must be stored
    bad_indexes: set[int]  # rejection indexes of the records that must be refused
    table_broken: str | None
    batch_broken: str | None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A batch of 1-12 records with distinct steps, some broken, split between the message and the
    table forms, perhaps with a broken table, batch-level field, or an odd side field."""
    n = draw(st.integers(1, 12))
    steps = draw(st.lists(st.integers(0, 2**62), min_size=n, max_size=n, unique=True))
    records = [draw(record(s)) for s in steps]
    in_messages = draw(st.integers(0, n))  # records [0, in_messages) as messages, the rest as a table
    broken: set[int] = set()
    for i in draw(st.sets(st.integers(0, n - 1), max_size=n)):
        pool = dict(RECORD_BREAKAGES)
        if i < in_messages:
            pool.update(MESSAGE_BREAKAGES)
        pool[draw(st.sampled_from(sorted(pool)))](records[i])
        broken.add(i)
    world = draw(st.integers(1, 4096))
    rank = draw(st.integers(0, world - 1))
    job = f"fuzz-{uuid.uuid4().hex[:10]}"
    b = f.batch(job, rank, world, agent_id=f"fz-{uuid.uuid4().hex[:12]}", steps=records[:in_messages])
    b.coords.dp_rank, b.coords.dp_size = rank, world
    table_broken = None
    if in_messages < n:
        table = to_table(records[in_messages:])
        if draw(st.integers(0, 4)) == 0:
            table_broken = draw(st.sampled_from(sorted(TABLE_BREAKAGES)))
            TABLE_BREAKAGES[table_broken](table)
        b.step_table.CopyFrom(table)
    batch_broken = None
    if draw(st.integers(0, 5)) == 0:
        batch_broken = draw(st.sampled_from(sorted(BATCH_BREAKAGES)))
        BATCH_BREAKAGES[batch_broken](b)
    for name in draw(st.sets(st.sampled_from(sorted(SIDE_FIELDS)), max_size=2)):
        SIDE_FIELDS[name](b)
    in_table = set(range(in_messages, n)) if table_broken else set()
    good = sorted(steps[i] for i in range(n) if i not in broken and i not in in_table)
    return Case(b, [] if batch_broken else good, broken - in_table, table_broken, batch_broken)


def _samples_kept(case: Case, ack: pb.Ack) -> int:
    """GPU samples count in an Ack's accepted records beside the steps."""
    return len(case.batch.gpu_samples) - sum(r.kind == "gpu_sample" for r in ack.rejections)


# -- the tests -------------------------------------------------------------------------------------
@FUZZ
@given(payload=st.binary(max_size=4096))
def test_random_bytes_get_a_clear_answer(counted: Server, payload: bytes) -> None:
    ack = counted.send(payload, "random_bytes")
    if ack is not None:  # bytes that happen to parse: refused for what they lack, or empty
        assert ack.accepted == 0 or ack.rejections == []


@FUZZ
@given(case=cases(), flips=st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)), max_size=4))
def test_mutated_bytes_of_a_batch_get_a_clear_answer(
    counted: Server, case: Case, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(case.batch.SerializeToString())
    for position, xor in flips:
        data[position % len(data)] ^= xor
    cut = len(data) - (flips[0][0] % 7 if flips else 0)
    counted.send(bytes(data[:cut]), "mutated_bytes")


@FUZZ
@given(case=cases())
def test_broken_records_are_refused_and_the_rest_stored(counted: Server, case: Case) -> None:
    ack = counted.send(case.batch.SerializeToString(), "generated_batch")
    assert ack is not None
    job = case.batch.coords.job
    if case.batch_broken:
        assert ack.accepted == 0
        assert [(r.kind, r.index) for r in ack.rejections] == [("batch", -1)], case.batch_broken
        return
    assert ack.accepted == len(case.good_steps) + _samples_kept(case, ack), ack
    step_rejections = {r.index for r in ack.rejections if r.kind == "step"}
    assert step_rejections == case.bad_indexes, ack
    if case.table_broken:
        whole = [r for r in ack.rejections if r.kind == "step_table"]
        assert [(r.index, r.reason) for r in whole] == [(-1, "bad_table")], case.table_broken
    assert counted.stored_steps(job) == case.good_steps


@FUZZ
@given(first=cases(), second=cases())
def test_a_resent_seq_with_other_records_is_refused_and_the_first_kept(
    counted: Server, first: Case, second: Case
) -> None:
    if first.batch_broken or second.batch_broken or not first.good_steps:
        return
    ack = counted.send(first.batch.SerializeToString(), "seq_reused")
    assert ack is not None and ack.accepted == len(first.good_steps) + _samples_kept(first, ack)
    again = counted.send(first.batch.SerializeToString(), "seq_reused")
    assert again is not None and again.duplicate and again.accepted == ack.accepted
    other = pb.Batch()
    other.CopyFrom(second.batch)
    other.agent_id, other.seq = first.batch.agent_id, first.batch.seq
    other.coords.CopyFrom(first.batch.coords)
    refused = counted.send(other.SerializeToString(), "seq_reused")
    assert refused is not None
    if sorted(second.good_steps) != sorted(first.good_steps):
        assert refused.accepted == 0 and [r.reason for r in refused.rejections] == ["seq_reused"]
    assert counted.stored_steps(first.batch.coords.job) == first.good_steps


@fuzz(15)
@given(
    count=st.integers(DEFAULT_MAX_PHASE_NAMES + 1, 3000),
    in_table=st.booleans(),
    per_record=st.integers(1, 400),
)
def test_many_phase_names_cost_only_their_own_job(
    counted: Server, count: int, in_table: bool, per_record: int
) -> None:
    """A batch naming a phase per span: every record stored, the job's dictionary at its limit."""
    job = f.new_job_id("names")
    records: list[pb.StepRecord] = []
    name = 0
    while name < count:
        r = f.dp_step(len(records), start=f.T0 + len(records))
        for i in range(min(per_record, count - name)):
            r.spans.add(kind=f"p{name + i}", start=r.start_time + 1e-5 * i, duration=1e-6)
        name += min(per_record, count - name)
        records.append(r)
    b = f.batch(job, 0, 1, steps=[] if in_table else records)
    if in_table:
        b.step_table.CopyFrom(to_table(records))
    ack = counted.send(b.SerializeToString(), "many_names")
    assert ack is not None and (ack.accepted, list(ack.rejections)) == (len(records), [])
    names = counted.phase_names(job)
    assert len(names - STANDARD_KINDS) == DEFAULT_MAX_PHASE_NAMES and "other" in names
    assert counted.stored_steps(job) == list(range(len(records)))
