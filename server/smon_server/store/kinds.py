"""Span kind names ↔ small integer codes, one dictionary per job attempt (table job_span_kinds).

A step record stores each span's kind as a two-byte code. The codes were once one dictionary for
the whole server, capped and never expiring: one client sending a few thousand made-up names (or a
script naming a phase per step, `f"eval:{step}"`) filled it, and every job's new phases were
refused after that. Now each job attempt has its own dictionary, and at most `limit`
(SMON_MAX_PHASE_NAMES) names in it beside the standard phases (STANDARD_KINDS, always admitted).
A name past the limit is *folded*: its spans are stored as `other`, so the record and its timing
are kept, and the job counts what was folded (jobs.folded_spans, shown in its summary). What one
job sends costs only that job.

Codes are assigned inside the transaction that stores the records, after the job's row is upserted:
that row stays locked until the commit, so two writers (or replicas) never add names to one job
at once, and no code can be given twice. A job's names are only ever added, so a code once
committed never changes: each process caches them (the least recently used jobs' forgotten past
`max_jobs`) with whether the job is full, which lets a group of known names skip the database.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from smon_server.store.models import SpanKind

# Phases every job may name whatever its limit (the agent's, the framework integrations', the
# pipeline's): a finite set, so the dictionary stays bounded.
STANDARD_KINDS = frozenset(
    {
        "data_wait", "h2d", "forward", "backward", "grad_sync", "optimizer", "checkpoint", "other",
        "gc", "eval", "log", "forward_send", "forward_recv", "backward_send", "backward_recv",
    }
)  # fmt: skip
FOLDED_INTO = "other"
DEFAULT_MAX_PHASE_NAMES = 64
MAX_CODE = 32_767  # job_span_kinds.code is int2


@dataclass
class JobKinds:
    """What one job attempt's dictionary holds (committed), and whether it is full."""

    codes: dict[str, int] = field(default_factory=dict)
    full: bool = False


@dataclass
class Resolved:
    """Codes for one job's names in one group: folded names map to `other`'s code; a name with no
    code at all (no code left: a dictionary of 32,767 names) is absent, its records refused."""

    codes: dict[str, int]
    folded: frozenset[str] = frozenset()
    learned: JobKinds | None = None  # the job's dictionary as this transaction leaves it


class SpanKinds:
    def __init__(self, limit: int = DEFAULT_MAX_PHASE_NAMES, max_jobs: int = 20_000) -> None:
        self.limit = limit
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[int, JobKinds] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, job_key: int, names: Iterable[str]) -> Resolved | None:
        """Codes of `names` from the cache alone, or None when any needs the database."""
        with self._lock:
            known = self._jobs.get(job_key)
            if known is None:
                return None
            self._jobs.move_to_end(job_key)
            codes: dict[str, int] = {}
            folded: set[str] = set()
            for name in names:
                code = known.codes.get(name)
                if code is None:
                    other = known.codes.get(FOLDED_INTO)
                    if not known.full or name in STANDARD_KINDS or other is None:
                        return None
                    code = other
                    folded.add(name)
                codes[name] = code
        return Resolved(codes, frozenset(folded))

    def resolve(self, session: Session, job_key: int, names: Iterable[str]) -> Resolved:
        """Codes of `names` for the job, adding new ones within its limit and folding the rest into
        `other`. The caller's transaction must hold the job's row lock (it upserted the row)."""
        wanted = list(dict.fromkeys(names))
        have = {
            str(n): int(c)
            for n, c in session.execute(
                select(SpanKind.name, SpanKind.code).where(SpanKind.job_key == job_key)
            )
        }
        custom = sum(1 for n in have if n not in STANDARD_KINDS)
        # Past the largest code first: a job's name tuple (kind_names) then only ever grows, which
        # the window's chunked reads rely on (StepColumns.concat); holes only once that runs out.
        taken = set(have.values())
        top = max(taken, default=0)
        free = itertools.chain(range(top + 1, MAX_CODE + 1), (c for c in range(1, top) if c not in taken))
        added: list[dict[str, object]] = []

        def add(name: str) -> None:
            code = next(free, None)
            if code is not None:
                have[name] = code
                added.append({"job_key": job_key, "code": code, "name": name})

        folded: set[str] = set()
        for name in wanted:
            if name in have:
                continue
            if name in STANDARD_KINDS or custom < self.limit:
                add(name)
                if name in have and name not in STANDARD_KINDS:
                    custom += 1
            else:
                folded.add(name)
        if folded and FOLDED_INTO not in have:
            add(FOLDED_INTO)
        if added:
            session.execute(insert(SpanKind), added)
        codes = {name: have[name] for name in wanted if name in have}
        if FOLDED_INTO in have:
            codes.update({name: have[FOLDED_INTO] for name in folded})
        learned = JobKinds(dict(have), full=custom >= self.limit)
        return Resolved(codes, frozenset(n for n in folded if n in codes), learned)

    def remember(self, learned: Mapping[int, JobKinds]) -> None:
        """Call once the transaction that stored these dictionaries has committed."""
        with self._lock:
            for job_key, kinds in learned.items():
                self._jobs[job_key] = kinds
                self._jobs.move_to_end(job_key)
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)

    def forget(self) -> None:
        with self._lock:
            self._jobs.clear()


def kind_names(session: Session, job_key: int) -> tuple[str, ...]:
    """The job attempt's kind names at the index of their code ("" where no name has the code)."""
    rows = [
        (int(c), str(n))
        for c, n in session.execute(select(SpanKind.code, SpanKind.name).where(SpanKind.job_key == job_key))
    ]
    out = [""] * (max((c for c, _ in rows), default=0) + 1)
    for code, name in rows:
        out[code] = name
    return tuple(out)


def kind_code(session: Session, job_key: int, name: str) -> int | None:
    return session.scalar(select(SpanKind.code).where(SpanKind.job_key == job_key, SpanKind.name == name))
