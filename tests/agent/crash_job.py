"""A training process that dies without closing (SIGKILL), run by test_sidecar.py."""

from __future__ import annotations

import os
import signal
import sys
import time

import smon


def main(server: str) -> None:
    mon = smon.attach(server=server, job="killed", nvml_interval=0, flush_interval=0.05)
    for _ in range(5):
        mon.step()
    deadline = time.monotonic() + 10
    while mon.counters()["acked_batches"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # connected: steps 0-4 are out
    for _ in range(5):
        mon.step()
    time.sleep(0.3)  # steps 5-9 reach the shipper process...
    print(mon.feeder.outlet.pid, flush=True)  # type: ignore[attr-defined]
    os.kill(os.getpid(), signal.SIGKILL)  # ...and the trainer dies without closing


if __name__ == "__main__":
    main(sys.argv[1])
