"""Put every worker's op times on one clock, from the ends that all participants share.

Agents correct their wall clock with the server's round-trip estimate, which leaves offsets of
a fraction of a round trip between hosts. Transfer-vs-waiting separation compares start times of
different hosts, so milliseconds matter for fast collectives. A collective ends at (nearly) the
same instant on all its participants, and a send ends with its recv: the median of a worker's
end times against its groups' end times estimate its remaining offset (least squares over all
groups and steps, see `estimate_offsets`).

Opt-in (`WhatIfConfig.align_clocks`): traces recorded on one clock, like the conformance traces,
need nothing, and a job without collectives has nothing to align on.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from smon_server.whatif.graph import build_graph
from smon_server.whatif.layout import build_layout
from smon_server.whatif.ops import OpTable
from smon_server.whatif.robust import median


def estimate_offsets(table: OpTable) -> dict[tuple[int, int], float]:
    """Clock offset of each worker (dp rank, stage), seconds; the median worker is 0.

    Least squares over every group instance (a collective on one step, a send with its recv):
    minimise sum (end_i - offset_w(i) - t_instance)^2. Eliminating the instance times leaves a
    graph-Laplacian system L o = b over workers, solved directly (workers are at most thousands).
    """
    layout = build_layout(table)
    graph = build_graph(layout)
    n_dp, n_stages = len(layout.dp_ranks), len(layout.stages)
    n_workers = n_dp * n_stages
    end = layout.start + layout.duration  # [slot, step, dp], NaN where absent
    laplacian = np.zeros((n_workers, n_workers))
    rhs = np.zeros(n_workers)
    dp = np.arange(n_dp)
    for members, spans in zip(graph.groups, graph.group_spans_dp, strict=True):
        idx = list(members)
        k = len(idx)
        ends = end[idx]  # [k, steps, dp]
        stages = layout.slot_stage[idx]
        workers = dp[None, :] * n_stages + stages[:, None]  # [k, dp]
        if spans and k * n_dp > 1:
            valid = ~np.isnan(ends).any(axis=(0, 2))  # per step
            residual = ends[:, valid] - ends[:, valid].mean(axis=(0, 2), keepdims=True)
            np.add.at(rhs, workers.ravel(), residual.sum(axis=1).ravel())
            w = workers.ravel()
            laplacian[np.ix_(w, w)] += valid.sum() * (np.eye(w.size) - 1.0 / w.size)
        elif k > 1:
            valid = ~np.isnan(ends).any(axis=0)  # [steps, dp]
            clean = np.where(valid, ends, 0.0)
            residual = (clean - clean.mean(axis=0, keepdims=True)) * valid
            np.add.at(rhs, workers.ravel(), residual.sum(axis=1).ravel())
            count = valid.sum(axis=0)  # [dp]
            a, b = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
            block = np.eye(k) - 1.0 / k
            rows = workers[a.ravel()]  # [k*k, dp]
            cols = workers[b.ravel()]
            np.add.at(
                laplacian, (rows.ravel(), cols.ravel()), (block.ravel()[:, None] * count[None, :]).ravel()
            )
    # The Laplacian is singular along "everyone shifts together" (and along any group of workers
    # that shares no op with the rest): a tiny ridge picks the smallest offsets there.
    ridge = 1e-9 * max(float(np.trace(laplacian)) / n_workers, 1.0)
    offset = np.linalg.solve(laplacian + ridge * np.eye(n_workers) + 1.0 / n_workers, rhs)
    offset -= float(median(offset))
    return {
        (int(layout.dp_ranks[d]), int(layout.stages[s])): float(offset[d * n_stages + s])
        for d in range(n_dp)
        for s in range(n_stages)
    }


def align_clocks(table: OpTable) -> tuple[OpTable, dict[tuple[int, int], float]]:
    """The table with each worker's start times moved onto the common clock, and the offsets."""
    offsets = estimate_offsets(table)
    # Looked up by (dp rank, stage) key, not in a grid as large as the largest rank numbers.
    keys = np.array([(int(d) << 32) | int(s) for d, s in offsets], dtype=np.int64)
    order = np.argsort(keys)
    row_keys = (table.dp_rank.astype(np.int64) << 32) | table.stage.astype(np.int64)
    at = order[np.clip(np.searchsorted(keys[order], row_keys), 0, keys.size - 1)]
    shift = np.where(keys[at] == row_keys, np.array(list(offsets.values()))[at], 0.0)
    return replace(table, start=table.start - shift), offsets
