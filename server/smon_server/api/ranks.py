"""/api/v1/jobs/{job_id}/ranks: where each rank runs, so a view can group ranks by host."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel

from smon_server.api.deps import ApiTokenDep, DbDep
from smon_server.store import queries

router = APIRouter(prefix="/api/v1", tags=["jobs"])


class RankOut(BaseModel):
    rank: int
    host: str
    local_rank: int
    dp_rank: int
    stage: int
    tp_rank: int
    gpu_uuid: str


class RanksOut(BaseModel):
    job_id: str
    ranks: list[RankOut]


@router.get("/jobs/{job_id:path}/ranks", response_model=RanksOut)
def ranks(job_id: str, db: DbDep, _auth: ApiTokenDep) -> RanksOut:
    """Every rank's newest agent (a restarted rank reports under a new one), by rank."""
    if queries.get_job(session=db, job_id=job_id) is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return RanksOut(
        job_id=job_id,
        ranks=[
            RankOut(
                rank=a.rank,
                host=a.host,
                local_rank=a.local_rank,
                dp_rank=a.dp_rank,
                stage=a.pp_rank,
                tp_rank=a.tp_rank,
                gpu_uuid=a.gpu_uuid,
            )
            for a in queries.job_agents(session=db, job_id=job_id)
        ],
    )
