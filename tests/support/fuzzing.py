"""How long the fuzz tests run: small and the same every time in CI, as long as asked outside it.

    SMON_FUZZ_EXAMPLES=5000 SMON_FUZZ_SEED=7 pytest tests/ingest/test_grpc_fuzz.py tests/api/test_fuzz.py

`SMON_FUZZ_EXAMPLES` is the number of inputs each fuzz test draws (default: each test's own small
number); `SMON_FUZZ_SEED` draws them from that seed instead of hypothesis's fixed derandomised
stream, so a longer run explores new inputs and a failure it finds can be run again exactly;
`random` picks a seed and prints it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, seed, settings

T = TypeVar("T", bound=Callable[..., Any])


def examples(default: int) -> int:
    return int(os.environ.get("SMON_FUZZ_EXAMPLES") or default)


def chosen_seed() -> int | None:
    value = os.environ.get("SMON_FUZZ_SEED") or (
        "random" if os.environ.get("SMON_FUZZ_RANDOM") == "1" else ""
    )
    if not value:
        return None
    if value == "random":
        picked = random.SystemRandom().randrange(2**32)
        print(f"\nSMON_FUZZ_SEED={picked}")
        os.environ["SMON_FUZZ_SEED"] = str(picked)  # every test of the run draws from the same
        return picked
    return int(value)


def fuzz(default_examples: int, **extra: Any) -> Callable[[T], T]:
    """Hypothesis settings (and seed) for one fuzz test."""
    chosen = chosen_seed()
    applied = settings(
        max_examples=examples(default_examples),
        deadline=None,
        database=None,
        derandomize=chosen is None,
        suppress_health_check=list(HealthCheck),
        **extra,
    )

    def wrap(test: T) -> T:
        test = applied(test)
        return seed(chosen)(test) if chosen is not None else test

    return wrap
