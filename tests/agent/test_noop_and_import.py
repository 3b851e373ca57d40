"""`import smon` stays light; disabled SMon is a no-op in every method; attach never raises."""

from __future__ import annotations

import subprocess
import sys
import threading

import torch

import smon
from tests.agent.torch_models import SlowDataset, mlp, train

HEAVY = "[m for m in ('torch', 'pynvml', 'numpy', 'grpc') if m in sys.modules]"


def test_import_is_light():
    code = f"import sys, smon; print({HEAVY}, 'google.protobuf' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True"


def test_training_process_never_loads_grpc_or_torch_it_was_not_given(ingest):
    # gRPC lives in the shipper process: a training process that forks DataLoader workers must
    # not hold gRPC's threads (its fork handlers crash children, grpc/grpc#32758).
    code = (
        f"import sys, smon; m = smon.attach(server='{ingest.address}', nvml_interval=0, job='light'); "
        f"m.step(); m.close(); print({HEAVY})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert ingest.servicer.step_numbers() == [0]


def check_noop(mon: smon.Monitor) -> None:
    assert type(mon) is smon.Monitor and not mon.enabled
    mon.step()
    mon.step(step=7)
    mon.set_step(3)
    with mon.phase("checkpoint", microbatch=1, chunk=2):
        pass
    mon.record_batch([1, 2, 3])
    assert mon.counters() == {}
    mon.close()
    with mon as same:
        assert same is mon


def test_enable_false_is_a_noop_with_no_threads_and_no_hooks():
    threads = set(threading.enumerate())
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(SlowDataset(n=8), batch_size=4)
    mon = smon.attach(model, optimizer, loader, enable=False)
    check_noop(mon)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert type(model) is torch.nn.Sequential
    assert not optimizer._optimizer_step_post_hooks and type(loader) is torch.utils.data.DataLoader
    train(model, optimizer, loader)
    assert set(threading.enumerate()) <= threads  # nothing started


def test_smon_disable_env(monkeypatch):
    monkeypatch.setenv("SMON_DISABLE", "1")
    check_noop(smon.attach(server="127.0.0.1:1"))


def test_attach_that_cannot_start_returns_a_noop_and_says_why(monkeypatch, caplog):
    def broken(**kwargs):
        raise RuntimeError("cannot read config")

    monkeypatch.setattr("smon.api.resolve_config", broken)
    mon = smon.attach(server="127.0.0.1:1")
    check_noop(mon)
    assert any("could not start" in r.getMessage() for r in caplog.records)


def test_context_manager_closes(ingest, attach_fast):
    with attach_fast(server=ingest.address) as mon:
        mon.step()
    assert ingest.servicer.step_numbers() == [0]
    assert mon.counters()["queued"] == 0


def test_demo_training_scripts_do_not_load_the_server_stack():
    # Every rank of a demo or test job imports one of these: the server's web and database stack
    # (FastAPI, SQLAlchemy, uvicorn: ~2 s per rank on a 2-core machine) has no place there.
    scripts = ("train", "loop_train", "pipeline_train")
    server_side = "[m for m in ('fastapi', 'sqlalchemy', 'uvicorn', 'alembic', 'httpx') if m in sys.modules]"
    imports = "; ".join(f"import smon_server.demo.{s}" for s in scripts)
    code = f"import sys; {imports}; print({server_side})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
