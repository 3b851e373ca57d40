"""The shipper process: the training process survives its death or hang, and it survives the trainer's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from smon.outlet import ProcessOutlet

ROOT = Path(__file__).resolve().parents[2]


def outlet_of(mon) -> ProcessOutlet:
    outlet = mon.feeder.outlet
    assert isinstance(outlet, ProcessOutlet)
    return outlet


def test_a_killed_shipper_process_is_replaced_and_training_goes_on(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    mon.feeder.restart_interval = 0.0
    mon.step()
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == [0])
    first = outlet_of(mon)
    os.kill(first.pid, signal.SIGKILL)
    first._process.wait(5)
    deadline = time.monotonic() + 10
    while outlet_of(mon) is first and time.monotonic() < deadline:
        mon.step()  # never raises into the loop
        time.sleep(0.02)
    assert outlet_of(mon) is not first
    mon.step()
    last = mon.counters()["last_step"]
    assert ingest.servicer.wait_for(lambda s: last in s.step_numbers())
    agents = {b.agent_id for b in ingest.servicer.snapshot() if b.steps}
    assert len(agents) == 2  # the new process is a new agent instance
    mon.close()
    counters = mon.counters()
    assert counters["errors"] >= 1  # said once, counted


def test_a_wedged_shipper_process_cannot_block_close(ingest, attach_fast, monkeypatch):
    monkeypatch.setattr(ProcessOutlet, "send_timeout", 0.3)
    mon = attach_fast(server=ingest.address, flush_timeout=0.5)
    mon.step()
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == [0])
    outlet = outlet_of(mon)
    os.kill(outlet.pid, signal.SIGSTOP)  # stops reading its pipe
    try:
        for _ in range(2000):  # far more than the pipe buffer holds
            mon.step()
        started = time.monotonic()
        mon.close()
        assert time.monotonic() - started < 3.0
        assert mon.counters()["dropped_records"] > 0
    finally:
        os.kill(outlet.pid, signal.SIGCONT)
        outlet._process.kill()
        outlet._process.wait(5)


def test_the_shipper_flushes_after_the_trainer_is_killed(ingest):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    job = subprocess.run(
        [sys.executable, "-m", "tests.agent.crash_job", ingest.address],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert job.returncode == -signal.SIGKILL
    sidecar = int(job.stdout.split()[0])
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == list(range(10)))
    assert not any(b.final for b in ingest.servicer.snapshot())  # died: no final batch
    deadline = time.monotonic() + 10
    while Path(f"/proc/{sidecar}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{sidecar}").exists()  # and it did not outlive its job
