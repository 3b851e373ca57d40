"""Where each replay variant takes its durations from: measured D, idealised D*, or a mix.

A what-if variant is "D* everywhere except slice X measured" (add-back) or "D everywhere except X
idealised" (removal); both are a boolean *restore* mask over (slot, DP replica). Sources add a
slot's durations for a whole batch of variants in one or two array operations.

`ReplicaSource` is the add-back by DP rank: with every other rank ideal, all other replicas are
identical (same program, same D*), so each variant needs only two replicas — the restored rank
and one ideal stand-in — instead of all of them. DP-spanning groups still see both through the
maximum over the replica axis.
"""

from __future__ import annotations

import numpy as np

from smon_server.whatif.durations import Jitter


class IdealSource:
    """D* everywhere: one scalar per slot (the same on every step and replica)."""

    def __init__(self, ideal: np.ndarray) -> None:
        self.ideal = ideal

    def add(self, slot: int, start: np.ndarray, out: np.ndarray) -> None:
        np.add(start, self.ideal[slot], out=out)


class MaskedSource:
    """Batch shape [variant, step, dp]: variant v is measured where restore[v, slot, dp]."""

    def __init__(self, measured: np.ndarray, ideal: np.ndarray, restore: np.ndarray) -> None:
        self.measured = measured  # [n_slots, n_steps, n_dp]
        self.ideal = ideal.astype(measured.dtype)
        per_variant = np.asarray(restore.all(axis=2) | ~restore.any(axis=2))  # uniform over DP
        self.kind: list[int] = []
        self.mask: list[np.ndarray | None] = []
        # Kind 3: restored on whole variants (uniform over DP), listed: those variants get the
        # measured durations added one by one, which is the same arithmetic as the masked add
        # without a masked ufunc loop over every variant (a few variants of tens restore a slot).
        self.variants: list[np.ndarray | None] = []
        for j in range(restore.shape[1]):
            r = restore[:, j, :]
            variants = None
            if not r.any():
                self.kind.append(0)
                self.mask.append(None)
            elif r.all():
                self.kind.append(1)
                self.mask.append(None)
            elif per_variant[:, j].all():
                self.kind.append(3)
                self.mask.append(None)
                variants = np.flatnonzero(r[:, 0])
            else:
                self.kind.append(2)
                self.mask.append(r[:, None, :])  # [V, 1, dp]
            self.variants.append(variants)

    def add(self, slot: int, start: np.ndarray, out: np.ndarray) -> None:
        kind = self.kind[slot]
        if kind == 1:
            np.add(start, self.measured[slot], out=out)
            return
        ideal = self.ideal[slot]
        np.add(start, ideal, out=out)
        if kind == 2:
            np.add(out, self.measured[slot] - ideal, out=out, where=self.mask[slot])
        elif kind == 3:
            variants = self.variants[slot]
            assert variants is not None
            delta = self.measured[slot] - ideal  # the same sum as the masked add: (start + D*) + (D - D*)
            for v in variants:
                np.add(out[v], delta, out=out[v])


class ReplicaSource:
    """Batch shape [2, dp rank restored, step]: replica 0 is that rank, measured; replica 1 is
    the ideal stand-in for every other rank."""

    def __init__(self, measured: np.ndarray, ideal: np.ndarray) -> None:
        self.measured = measured  # [n_slots, n_variants, n_steps]
        self.ideal = ideal.astype(measured.dtype)

    def add(self, slot: int, start: np.ndarray, out: np.ndarray) -> None:
        np.add(start[0], self.measured[slot], out=out[0])
        np.add(start[-1], self.ideal[slot], out=out[1])


class ReplicaJitterSource:
    """ReplicaSource's shape, but replica 0 is the rank at its *healthy* durations: D* plus its own
    ordinary jitter (as JitterSource) plus what its peers lost on the same step (`shared`, the
    lower median over DP ranks of each instance's deviation from its worker's mean). The reference
    a rank's measured add-back is set against under the robust estimator: neither its own
    ordinary jitter nor a step on which every rank was slow is blamed on it."""

    def __init__(
        self, measured: np.ndarray, ideal: np.ndarray, mean: np.ndarray, cap: np.ndarray, shared: np.ndarray
    ) -> None:
        self.measured = measured  # [n_slots, n_variants, n_steps]
        self.ideal = ideal.astype(measured.dtype)
        self.mean = mean  # [n_slots, n_variants]: Jitter.mean of the batch's ranks
        self.cap = cap
        self.shared = shared  # [n_slots, n_steps]

    def add(self, slot: int, start: np.ndarray, out: np.ndarray) -> None:
        measured = self.measured[slot]  # [variant, step]
        deviation = measured - self.mean[slot][:, None]
        np.clip(deviation, -self.cap[slot], self.cap[slot], out=deviation)
        deviation[measured <= 0] = 0.0
        deviation += self.ideal[slot]
        deviation += self.shared[slot][None, :]
        np.maximum(deviation, 0.0, out=deviation)
        np.add(start[0], deviation, out=out[0])
        np.add(start[-1], self.ideal[slot], out=out[1])


class JitterSource:
    """The healthy ideal: D* plus each instance's ordinary jitter (durations.Jitter), batch shape
    [1, step, dp]; `measured` is the batch's step range."""

    def __init__(self, measured: np.ndarray, ideal: np.ndarray, jitter: Jitter) -> None:
        self.measured = measured
        self.ideal = ideal.astype(measured.dtype)
        self.jitter = jitter

    def add(self, slot: int, start: np.ndarray, out: np.ndarray) -> None:
        j = self.jitter
        measured = self.measured[slot]
        deviation = measured - j.mean[slot]
        np.clip(deviation, -j.cap[slot], j.cap[slot], out=deviation)
        deviation[measured <= 0] = 0.0  # absent here: the ideal instance is D*
        deviation += self.ideal[slot]
        np.maximum(deviation, 0.0, out=deviation)
        np.add(start, deviation, out=out)
