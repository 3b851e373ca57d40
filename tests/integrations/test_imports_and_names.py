"""The integrations without a training job: importing SMon imports no framework, the job's name,
the optimizer unwrapping, the phase timers, and torchtitan's coordinates and Trainer subclass."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from smon.integrations.base import PhaseTimers, job_name, torch_loader, torch_optimizer
from smon.integrations.torchtitan import parallel_coordinates
from smon.monitor import Monitor
from tests.support.paths import REPO_ROOT

FRAMEWORKS = ("transformers", "lightning", "accelerate", "deepspeed", "torchtitan", "torch")


def test_importing_smon_imports_no_framework() -> None:
    code = (
        "import sys, smon, smon.integrations, smon.integrations.base, smon.integrations.torchtitan, "
        "smon.integrations.accelerate, smon.integrations.deepspeed\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_job_is_the_run_name_unless_smon_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMON_JOB", raising=False)
    assert job_name("llama-run-17") == "llama-run-17"
    assert job_name("  ") is None
    assert job_name(None) is None
    monkeypatch.setenv("SMON_JOB", "from-env")
    assert job_name("llama-run-17") is None  # attach reads SMON_JOB itself


class Wrapper:
    """A framework's optimizer wrapper: itself a torch optimizer or not, holding the real one."""

    def __init__(self, inner: Any, attr: str = "optimizer") -> None:
        setattr(self, attr, inner)


def test_the_innermost_torch_optimizer_is_found() -> None:
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    assert torch_optimizer(sgd) is sgd
    assert torch_optimizer(Wrapper(Wrapper(sgd, "_optimizer"))) is sgd
    assert torch_optimizer(Wrapper(object())) is None
    assert torch_optimizer(None) is None


def test_the_loader_a_framework_wraps_is_found() -> None:
    loader: Any = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(3)))
    shard = SimpleNamespace(base_dataloader=loader)
    assert torch_loader(shard) is loader
    assert torch_loader(loader) is loader


class Recorder(Monitor):
    enabled = True

    def __init__(self) -> None:
        self.phases: list[str] = []

    def phase(self, name: str, microbatch: int | None = None, chunk: int = 0) -> Any:
        self.phases.append(name)
        return super().phase(name, microbatch, chunk)


class Saver:
    def save(self, where: str) -> str:
        return f"saved {where}"


def test_phase_timers_time_the_instance_and_put_it_back() -> None:
    monitor, saver, other = Recorder(), Saver(), Saver()
    timers = PhaseTimers(monitor)
    assert timers.wrap(saver, "save", "checkpoint")
    assert not timers.wrap(saver, "missing", "checkpoint")
    assert saver.save("x") == "saved x"
    assert other.save("y") == "saved y"  # the class is left alone
    assert monitor.phases == ["checkpoint"]
    timers.restore()
    assert "save" not in vars(saver)
    saver.save("z")
    assert monitor.phases == ["checkpoint"]
    assert not PhaseTimers(Monitor()).wrap(saver, "save", "checkpoint")  # SMon off: nothing wrapped


def test_torchtitan_coordinates_follow_its_mesh_order() -> None:
    """pp, dp_replicate, dp_shard, cp, tp (tp fastest): 2 x 2 x 2 x 1 x 2 = 16 ranks."""
    dims = SimpleNamespace(pp=2, dp_replicate=2, dp_shard=2, cp=1, tp=2)
    coords = [parallel_coordinates(dims, r) for r in range(16)]
    assert len({(c["dp_rank"], c["pp_rank"], c["tp_rank"]) for c in coords}) == 16
    assert coords[0] == {"tp_rank": 0, "tp_size": 2, "dp_rank": 0, "dp_size": 4, "pp_rank": 0, "pp_size": 2}
    assert coords[1]["tp_rank"] == 1 and coords[2]["dp_rank"] == 1 and coords[4]["dp_rank"] == 2
    assert coords[8]["pp_rank"] == 1 and coords[8]["dp_rank"] == 0
    with_cp = parallel_coordinates(SimpleNamespace(pp=1, dp_replicate=1, dp_shard=2, cp=2, tp=2), 6)
    # rank 6 = (dp_shard 1, cp 1, tp 0): cp folds into tp as cp * tp + tp
    assert with_cp == {"tp_rank": 2, "tp_size": 4, "dp_rank": 1, "dp_size": 2, "pp_rank": 0, "pp_size": 1}
    assert parallel_coordinates(SimpleNamespace(pp=1, dp_replicate=1, dp_shard=-1, cp=1, tp=1), 0) == {}
    assert parallel_coordinates(None, 0) == {}


def test_torchtitan_trainer_subclass_builds_itself() -> None:
    """torchtitan's extension point: a Trainer subclass whose Config builds it. torchtitan is not
    in `make venv` (its wheel pulls wandb, tensorboard and datasets), so this runs where it is
    installed; its Trainer needs CUDA to train (docs/integrations.md says what was not run)."""
    trainer_module = pytest.importorskip("torchtitan.trainer", reason="torchtitan is not installed")
    from smon.integrations.torchtitan import SMonTrainer

    assert issubclass(SMonTrainer, trainer_module.Trainer)
    assert SMonTrainer.Config._owner is SMonTrainer


def test_torchtitan_hook_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """attach() on torchtitan's own parts, up to what runs without CUDA: the OptimizersContainer
    (steps end at its step), ParallelDims (coordinates), and the methods its Trainer.train calls
    on the checkpointer, validator and metrics processor, timed as phases, with a real gRPC ingest
    server receiving the steps. A whole Trainer (its model registry, CUDA) was not built."""
    pytest.importorskip("torchtitan.trainer", reason="torchtitan is not installed")
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
    from torchtitan.components.validate import Validator
    from torchtitan.distributed.parallel_dims import ParallelDims

    from smon.integrations import torchtitan as smon_torchtitan
    from tests.agent.ingest_server import IngestServer, RecordingIngest

    for cls, method in ((CheckpointManager, "save"), (Validator, "validate"), (MetricsProcessor, "log")):
        assert callable(getattr(cls, method)), (cls, method)  # what Trainer.train calls
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.delenv("SMON_JOB", raising=False)
    monkeypatch.setenv("WANDB_RUN_NAME", "titan-run")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})]
    optimizers = OptimizersContainer.Config(implementation="for-loop", param_groups=groups).build(
        model_parts=[model]
    )
    calls: list[str] = []
    trainer = SimpleNamespace(
        model_parts=[model],
        optimizers=optimizers,
        dataloader=None,
        step=0,
        parallel_dims=ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=2, ep=1, world_size=16),
        checkpointer=SimpleNamespace(save=lambda step, last_step=False: calls.append("save")),
        validator=SimpleNamespace(validate=lambda parts, step: calls.append("validate")),
        metrics_processor=SimpleNamespace(log=lambda step, *a, **k: calls.append("log")),
    )
    server = IngestServer(RecordingIngest()).start()
    try:
        monitor = smon_torchtitan.attach(trainer, server=server.address, nvml_interval=0)
        for step in range(1, 4):
            model(torch.randn(4, 8)).sum().backward()
            optimizers.step()
            optimizers.zero_grad()
            trainer.metrics_processor.log(step)
            trainer.checkpointer.save(step)
            trainer.validator.validate(trainer.model_parts, step)
        monitor.close(timeout=10)
        steps = server.servicer.steps()
        coords = server.servicer.snapshot()[0].coords
    finally:
        server.stop()
    assert calls == ["log", "save", "validate"] * 3
    assert sorted(s.step for s in steps) == [0, 1, 2]
    assert {"forward", "backward", "optimizer"} <= set(steps[0].phases)
    assert {"log", "checkpoint", "eval"} <= {k for s in steps for k in s.phases}
    assert coords.job == "titan-run"
    expected = parallel_coordinates(trainer.parallel_dims, 5)
    assert (coords.dp_rank, coords.pp_rank, coords.tp_rank) == (
        expected["dp_rank"], expected["pp_rank"], expected["tp_rank"]
    )  # fmt: skip
    assert (coords.dp_size, coords.pp_size, coords.tp_size) == (4, 2, 2)
