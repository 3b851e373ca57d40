"""The demo training script, each rank on a host of its own: how the fleet tests run several
"machines" on one. Set per job: SMON_TEST_HOSTS (host of rank r is the r-th, comma-separated),
SMON_TEST_SICK_HOST and SMON_TEST_SICK_NVML (that host's ranks get FakeNvml of that spec),
SMON_TEST_ALL_SLOW=1 (every rank slows its own forward by --delay: a job-wide slowdown).

    torchrun --nproc-per-node 2 -m tests.hosts.host_job --steps 40 --slow-rank 1 --delay 0.04
"""

from __future__ import annotations

import os
import sys

from smon_server.demo.train import main

if __name__ == "__main__":
    rank = int(os.environ.get("RANK", "0"))
    hosts = os.environ["SMON_TEST_HOSTS"].split(",")
    host = hosts[rank % len(hosts)]
    os.environ["SMON_HOST"] = host
    os.environ.pop("SMON_FAKE_NVML", None)
    if host == os.environ.get("SMON_TEST_SICK_HOST"):
        os.environ["SMON_FAKE_NVML"] = os.environ["SMON_TEST_SICK_NVML"]
    argv = sys.argv[1:]
    if os.environ.get("SMON_TEST_ALL_SLOW") == "1":
        argv += ["--slow-rank", str(rank)]
    main(argv)
