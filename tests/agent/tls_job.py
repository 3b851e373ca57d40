"""A training process whose agent cannot talk to its TLS server (plain text, or the wrong CA),
run by test_tls.py, which reads what the job's stderr shows. It steps for `seconds` (about ten
reconnect attempts a second at the test's backoff) and then closes, retrying meanwhile."""

from __future__ import annotations

import sys
import time

import smon


def main(server: str, ca_file: str, seconds: float) -> None:
    mon = smon.attach(
        server=server,
        job="tls-fault",
        tls_ca_file=ca_file or None,
        nvml_interval=0,
        flush_interval=0.05,
        backoff_base=0.02,
        backoff_cap=0.1,
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        mon.step()
        time.sleep(0.02)
    mon.close(timeout=1.0)
    print(mon.counters()["dropped_records"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
