"""`smon demo` and the training scripts it and the tests run under torchrun.

This package's `__init__` stays light: every rank of a demo job imports it on the way to its
training script, and those ranks need torch and `smon`, not the server's web and database stack
(about 2 s of imports per rank on a small machine). The demo itself is in `runner.py`.
"""

from __future__ import annotations

import sys


def training_command(ranks: int, args: list[str], module: str = "smon_server.demo.train") -> list[str]:
    """torchrun (as `python -m torch.distributed.run`) on a demo training script."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        module,
        *args,
    ]
