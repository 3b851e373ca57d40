"""A real 2-process gloo DDP job: grad_sync from autograd-engine callbacks, training results unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.agent import ddp_worker
from tests.agent.conftest import op_spans, unused_port

pytestmark = pytest.mark.torch

WORLD = 2


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory):
    from tests.agent.ingest_server import IngestServer, RecordingIngest

    server = IngestServer(RecordingIngest()).start()
    out = tmp_path_factory.mktemp("ddp")
    try:
        mp.start_processes(
            ddp_worker.run,
            args=(WORLD, unused_port(), server.address, str(out)),
            nprocs=WORLD,
            join=True,
            start_method="spawn",
        )
        results = {r: json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)}
        yield server.servicer, results
    finally:
        server.stop()


def steps_of(servicer, job: str, rank: int):
    return sorted(
        (s for b in servicer.snapshot() if b.coords.job == job and b.coords.rank == rank for s in b.steps),
        key=lambda s: s.step,
    )


def test_training_results_unchanged(ddp_run):
    _, results = ddp_run
    for rank in range(WORLD):
        assert results[rank]["agent"] == results[rank]["plain"]
        assert results[rank]["agent_errors"] == 0
    assert results[0]["plain"] != results[1]["plain"]  # ranks saw different data...


def test_grad_sync_is_the_exposed_wait_after_the_last_bucket(ddp_run):
    servicer, _ = ddp_run
    fast, slow = (steps_of(servicer, "ddp-agent", r) for r in (0, ddp_worker.SLOW_RANK))
    assert [s.step for s in fast] == list(range(ddp_worker.STEPS)) == [s.step for s in slow]
    for step in fast[1:] + slow[1:]:  # step 0 includes DDP's bucket rebuild
        spans = op_spans(step)
        assert [s.kind for s in spans] == ["forward", "backward", "grad_sync", "optimizer"]
        backward, grad_sync = spans[1], spans[2]
        assert grad_sync.start == pytest.approx(backward.start + backward.duration, abs=1e-4)
        assert step.phases["grad_sync"] == grad_sync.duration
    # The fast rank waits in grad_sync for the slow rank's backward; the slow rank does not wait.
    for fast_step, slow_step in zip(fast[1:], slow[1:], strict=True):
        assert fast_step.phases["grad_sync"] >= 0.5 * ddp_worker.BACKWARD_SLEEP
        assert slow_step.phases["backward"] >= ddp_worker.BACKWARD_SLEEP
        assert slow_step.phases["grad_sync"] < fast_step.phases["grad_sync"]
    coords = next(b.coords for b in servicer.snapshot() if b.coords.job == "ddp-agent" and b.coords.rank == 1)
    assert (coords.world_size, coords.dp_rank, coords.dp_size) == (2, 1, 2)


def test_reattach_to_the_same_ddp_model_measures_grad_sync_again(ddp_run):
    servicer, _ = ddp_run
    for rank in range(WORLD):
        steps = steps_of(servicer, "ddp-reattach", rank)
        assert len(steps) == ddp_worker.STEPS and all("grad_sync" in s.phases for s in steps)


def test_user_comm_hook_before_attach_is_left_alone_and_grad_sync_still_measured(ddp_run):
    servicer, results = ddp_run
    for rank in range(WORLD):
        assert results[rank]["calls"]["pre"] > 0
        assert results[rank]["pre_losses"] == results[rank]["plain"]
        assert results[rank]["pre_hooks"] == 1  # the user's; SMon registered none
        assert not [m for m in results[rank]["log"] if "comm hook" in m]
        steps = steps_of(servicer, "ddp-user-hook-before", rank)
        assert len(steps) == ddp_worker.STEPS
        assert all("grad_sync" in s.phases for s in steps)


def test_user_comm_hook_after_attach_is_registered_and_timed(ddp_run):
    servicer, results = ddp_run
    for rank in range(WORLD):
        assert results[rank]["calls"]["post"] > 0
        assert results[rank]["post_losses"] == results[rank]["plain"]
        steps = steps_of(servicer, "ddp-user-hook-after", rank)
        assert len(steps) == ddp_worker.STEPS
        assert all("grad_sync" in s.phases for s in steps)


def test_no_sync_micro_batches_have_no_grad_sync(ddp_run):
    servicer, results = ddp_run
    for rank in range(WORLD):
        assert results[rank]["no_sync_errors"] == 0
        steps = steps_of(servicer, "ddp-no-sync", rank)
        assert [s.step for s in steps] == list(range(ddp_worker.STEPS))
        for step in steps:
            backward = [s for s in step.spans if s.kind == "backward"]
            grad_sync = [s for s in step.spans if s.kind == "grad_sync"]
            assert [s.microbatch for s in backward] == [0, 1]
            assert len(grad_sync) == 1  # only the synchronised micro-batch
            assert grad_sync[0].start == pytest.approx(backward[1].start + backward[1].duration, abs=1e-4)


def test_module_attached_before_ddp_wraps_it(ddp_run):
    servicer, results = ddp_run
    for rank in range(WORLD):
        assert results[rank]["inner_losses"] == results[rank]["plain"]
        assert results[rank]["inner_class"] == "Sequential"  # close() restored the class under DDP
        steps = steps_of(servicer, "ddp-inner", rank)
        assert [[s.kind for s in op_spans(step)] for step in steps] == [
            ["forward", "backward", "optimizer"]
        ] * ddp_worker.STEPS
