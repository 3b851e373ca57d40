"""Device time hidden behind the host: which time line a device-timed step is replayed on.

With CUDA timing the agent times a step's phases on the device (where the work ran) and also
sends when the host issued each phase and for how long (Span.host_start / host_duration). On a
device-bound rank the device line is the critical path: the host races ahead issuing kernels and
later waits at a synchronising call. On a host-bound rank (a launch-bound model, a CPU
collective, a slow input pipeline) the device idles between the host's launches, and a kernel
that grows on that rank's device only eats into that idle time: the step takes no longer. The
device line cannot show this. Rank 1's forward span grows by what the device spent on the extra
kernel and the phases after it shrink by as much, as the device catches up while the host keeps
issuing; replayed op by op against its peers (whose forward is short and backward long) the grown
forward reads as slowdown and the shrunk backward as a fast peer, and the ideal step is shorter
than any rank ever ran (issue 29: S 1.08 against a measured 0.98).

So each device-timed record is replayed on the line that bounded it. A record is host-bound when
the host spent at least as long issuing its compute phases as the device spent running them
(within `HOST_BOUND_TOLERANCE` of the step): the device never ran ahead of the host, so the host's
split of the step between phases is the one any change would have to move. Collectives are left
out of that comparison: a host-blocking collective (gloo on CUDA tensors) waits for the device
inside its host span, which would make a device-bound step look host-bound. Host-bound records
have their device-timed spans replaced by their host views; device-bound records keep the device
line, so a slow GPU is still measured where it runs. Records without host views (host timing,
steps the agent did not sample for device timing, older agents) are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from smon_server.columns import StepColumns
from smon_server.whatif import ops as O

# A record whose compute phases took the host this much less than the device (fraction of the
# step, plus an absolute allowance for launch latency) is still host-bound: below it the device
# work a change could remove would not shorten the step by more than this.
HOST_BOUND_TOLERANCE = 0.02
HOST_BOUND_SLACK = 20e-6


def replay_line(cols: StepColumns, op_types: dict[str, str]) -> tuple[StepColumns, int]:
    """`cols` with each host-bound device-timed record on its host line, and how many records
    were moved. `op_types` maps span kinds to engine op types (collectives are told apart)."""
    if not cols.has_host or not len(cols):
        return cols, 0
    host_start, host_duration = cols.span_host_start, cols.span_host_duration
    viewed = np.isfinite(host_start) & np.isfinite(host_duration)
    if not viewed.any():
        return cols, 0
    comm_kind = np.array(
        [op_types.get(kind, kind) in O.COMMUNICATION_OP_TYPES for kind in cols.kinds], dtype=bool
    )
    compute = viewed & ~comm_kind[cols.span_kind] if comm_kind.size else viewed
    record = cols.span_record
    n = len(cols)
    host_total = np.bincount(record[compute], weights=host_duration[compute], minlength=n)
    device_total = np.bincount(record[compute], weights=cols.span_duration[compute], minlength=n)
    timed = np.bincount(record[compute], minlength=n) > 0
    slack = HOST_BOUND_TOLERANCE * cols.duration + HOST_BOUND_SLACK
    host_bound = timed & (host_total >= device_total - slack)
    if not host_bound.any():
        return cols, 0
    moved = viewed & host_bound[record]
    end = cols.duration[record[moved]]
    start = np.clip(host_start[moved], 0.0, end)
    span_start = cols.span_start.copy()
    span_duration = cols.span_duration.copy()
    span_start[moved] = start
    span_duration[moved] = np.clip(host_duration[moved], 0.0, end - start)
    return replace(cols, span_start=span_start, span_duration=span_duration), int(host_bound.sum())
