"""Request dependencies as Annotated aliases, so route signatures read as plain English."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from smon_server.alerts.notifiers import Notifier
from smon_server.settings import Settings
from smon_server.store import queries
from smon_server.store.db import Database
from smon_server.store.models import Job
from smon_server.store.queries import StepWindow

_bearer = HTTPBearer(auto_error=False)


class WindowAnalyser(Protocol):
    """Analyses a step window the pass has not stored (jobs/windows.py WindowAnalyses), so the
    API's modules need not import the analysis to name its type."""

    def analyse(self, session: Session, job: Job, window: StepWindow) -> dict[str, Any]: ...


class ApiContext(Protocol):
    """What the API reads of the server process it serves (context.py's ServerContext is one):
    the composition root hands it to create_app, the API does not import the root."""

    @property
    def settings(self) -> Settings: ...
    @property
    def db(self) -> Database: ...
    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def notifiers(self) -> list[Notifier]: ...
    @property
    def grpc_port(self) -> int: ...
    @property
    def windows(self) -> WindowAnalyser: ...
    @property
    def straggling_threshold(self) -> float: ...
    @property
    def attribution_threshold(self) -> float: ...
    def request_pass(self) -> None: ...


def get_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.context
    return context


ContextDep = Annotated[ApiContext, Depends(get_context)]


def get_settings(context: ContextDep) -> Settings:
    return context.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_db(context: ContextDep) -> Iterator[Session]:
    with context.db.session() as session:
        yield session


DbDep = Annotated[Session, Depends(get_db)]


def require_api_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """With SMON_API_TOKEN set, every API call needs `Authorization: Bearer <token>`."""
    if not settings.api_token:
        return
    presented = credentials.credentials if credentials else ""
    if not hmac.compare_digest(presented.encode(), settings.api_token.encode()):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong API token",
            headers={"WWW-Authenticate": "Bearer"},
        )


ApiTokenDep = Annotated[None, Depends(require_api_token)]


MAX_STEP = 2**62  # steps are stored as signed 64-bit integers: larger ones are a 422, not a 500
MAX_RANK = 2**31 - 1  # ranks are stored as signed 32-bit integers
# Which attempt of a job (a restart under the same id) a job route shows; default its newest.
AttemptDep = Annotated[
    int | None,
    Query(ge=1, le=2**31 - 1, description="an attempt of the job (1: its first run); default its newest"),
]
# A stored row's integer id (alerts, silences): past the signed 64-bit column it is a 422.
RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]


def get_step_window(
    from_step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="first step of the window")] = None,
    to_step: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="last step of the window")] = None,
    window: Annotated[int | None, Query(gt=0, le=MAX_STEP, description="the last N steps instead")] = None,
) -> StepWindow:
    return StepWindow(from_step=from_step, to_step=to_step, last=window)


WindowDep = Annotated[StepWindow, Depends(get_step_window)]


@dataclass(frozen=True)
class JobAttempt:
    """The job attempt a route shows, and how many the job has (every job response says both)."""

    job: Job
    attempts: int

    @property
    def which(self) -> dict[str, int]:
        """`attempt` and `attempts` of a response."""
        return {"attempt": self.job.attempt, "attempts": self.attempts}


def get_job(job_id: str, db: DbDep, attempt: AttemptDep = None) -> JobAttempt:
    """The job's attempt `?attempt=`, or its newest (then its attempt number is the count), or 404."""
    job = queries.get_job(session=db, job_id=job_id, attempt=attempt)
    if job is None:
        if attempt is not None and queries.get_job(session=db, job_id=job_id) is not None:
            raise HTTPException(status_code=404, detail=f"job {job_id!r} has no attempt {attempt}")
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    count = job.attempt if attempt is None else queries.attempt_count(session=db, job_id=job.job_id)
    return JobAttempt(job=job, attempts=count)


# A job route's job (path `{job_id:path}`, query `?attempt=`), resolved once.
JobDep = Annotated[JobAttempt, Depends(get_job)]
