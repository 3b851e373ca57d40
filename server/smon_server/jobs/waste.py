"""The job's running total of GPU-hours wasted, kept across analysis windows."""

from __future__ import annotations

import math
from typing import Any

from smon_server.store.models import Job


def accumulate_waste(*, job: Job, result: dict[str, Any]) -> None:
    """Add waste × GPUs × the wall time of steps not counted before to the job's running total."""
    end = result.get("window_end")
    start = result.get("window_start")
    waste = result["summary"].get("waste_fraction")
    if end is None or start is None or waste is None or not math.isfinite(waste):
        return
    counted_from = max(start, job.wasted_until or start)
    if end <= counted_from:
        return
    gpus = max(job.world_size, 1)
    job.gpu_hours_wasted = (job.gpu_hours_wasted or 0.0) + max(waste, 0.0) * gpus * (
        end - counted_from
    ) / 3600.0
    job.wasted_until = end
