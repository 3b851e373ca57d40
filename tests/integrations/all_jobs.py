"""Every framework's job in one torchrun launch (one process group, one import of each framework):
`all_jobs.py OUT PREFIX --slow-rank R --delay S` runs the Trainer, Accelerate, Lightning and
DeepSpeed jobs one after the other, each with its three runs named `PREFIX-<framework>-<run>`
(see jobs.py), and writes OUT/<framework>/report.json. Each job file also runs alone
(`hf_job.py OUT PREFIX`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integrations import accelerate_job, deepspeed_job, hf_job, lightning_job
from tests.integrations.jobs import main, write_report

FRAMEWORKS: dict[str, Callable[..., dict[str, dict[str, Any]]]] = {
    "transformers": hf_job.runs,
    "accelerate": accelerate_job.runs,
    "lightning": lightning_job.runs,
    "deepspeed": deepspeed_job.runs,
}


def runs(out: Path, prefix: str, slow_rank: int, delay: float) -> dict[str, dict[str, Any]]:
    """Each framework's runs, each reported in OUT/<framework>/report.json."""
    for name, framework_runs in FRAMEWORKS.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        write_report(folder, framework_runs(folder, f"{prefix}-{name}", slow_rank, delay))
    return {}


if __name__ == "__main__":
    main(runs, deepspeed_job.init_process_group)
