"""Estimate server clock − agent clock with the `Clock` RPC (NTP-style, minimum round trip wins).

Analysis compares start times across hosts (transfer = end − max start of the group), so every
agent reports its offset with each batch. The sample with the shortest round trip has the least
room for asymmetric delay, so it is the one kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smon.v1 import ingest_pb2 as pb


@dataclass(frozen=True)
class OffsetEstimate:
    offset: float  # seconds to add to agent time to get server time
    rtt: float  # round trip of the sample it came from


def estimate_offset(
    stub: Any, *, samples: int, timeout: float, metadata: Sequence[tuple[str, str]] = ()
) -> OffsetEstimate:
    """Run `samples` Clock round trips; raises grpc.RpcError if the server cannot be asked."""
    best: OffsetEstimate | None = None
    for _ in range(max(1, samples)):
        sent = time.time()
        reply = stub.Clock(pb.ClockRequest(agent_time=sent), timeout=timeout, metadata=metadata)
        received = time.time()
        rtt = received - sent
        estimate = OffsetEstimate(offset=reply.server_time - (sent + received) / 2.0, rtt=rtt)
        if best is None or estimate.rtt < best.rtt:
            best = estimate
    assert best is not None
    return best
