"""host_work: time a rank spends outside every timed phase (or in evaluation / its own phases)
while the other ranks wait for it at the next collective.

Share: the add-back share of the host-work op types together (`host`, and phases such as `eval`
that no other cause claims). Named: the workers that stand out from their DP peers in them
(stragglers.surplus_by_type), with how much per step and on which steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smon_server.whatif.diagnosis.base import HOST_WORK, Diagnosis, Facts, clip01, num
from smon_server.whatif.diagnosis.stragglers import cause_of, surplus_by_type, when_lost


def host_work(f: Facts) -> list[Diagnosis]:
    groups = [g for g in f.result.by_op_type if cause_of(g) == HOST_WORK]
    share = clip01(sum(f.addback_share(g) for g in groups))
    found = surplus_by_type(f)
    if not groups or share < f.config.min_share or found is None:
        return []
    names, _, surplus = found
    rows = [names.index(g) for g in groups if g in names]
    extra = np.clip(surplus[rows], 0.0, None).sum(axis=0)  # [dp, stage] seconds per step
    ideal = max(f.result.ideal_step_time, 1e-12)
    order = np.argsort(-extra, axis=None, kind="stable")[: f.config.max_named_workers]
    named = []
    for k in order:
        w = tuple(int(i) for i in np.unravel_index(int(k), extra.shape))
        if extra[w] < 0.25 * float(extra.max()) or extra[w] < 0.01 * ideal:
            break
        named.append(w)
    evidence: dict[str, Any] = {
        "host_work_share": num(share),
        "by_op_type": {g: num(f.result.by_op_type[g]) for g in groups},
        "workers": [
            {
                **f.worker(*w),
                "extra_s_per_step": num(float(extra[w])),
                "op_types": {
                    names[r]: num(float(surplus[r][w])) for r in rows if surplus[r][w] > 0.01 * ideal
                },
                **when_lost(f, [names[r] for r in rows], w),
            }
            for w in named
        ],
    }
    return [
        Diagnosis(
            cause=HOST_WORK,
            share=share,
            confidence=clip01(0.6 + 0.4 * (1.0 if named else 0.0) * min(1.0, share * 2)),
            evidence=evidence,
            recommendation=_advice(f, named, evidence),
            workers=tuple((int(f.result.dp_ranks[d]), int(f.result.stages[s])) for d, s in named),
            ranks=tuple(r for w in named for r in f.ranks_of(*w)),
        )
    ]


def _advice(f: Facts, named: list[tuple[int, ...]], evidence: dict[str, Any]) -> str:
    if not named:
        return (
            "Every rank spends time outside the timed phases (logging, evaluation, host-side "
            "preprocessing): profile the host side of the loop, or wrap its parts in "
            "`with mon.phase('name'):` so SMon can name them."
        )
    first = evidence["workers"][0]
    who = f.where(*named[0]) + (f" and {len(named) - 1} more" if len(named) > 1 else "")
    when = (
        f"every {first['every_n_steps']} steps (up to {first['max_s']:.3g} s)"
        if "every_n_steps" in first
        else ("on every step" if first.get("on_every_step") else "on some steps")
    )
    kinds = ", ".join(first["op_types"]) or "host"
    return (
        f"{who} does work the other ranks do not ({kinds}: {first['extra_s_per_step']:.3g} s per step, "
        f"{when}), and every other rank waits for it at the next collective. Move it off the "
        "critical path: run evaluation on all ranks (or in a separate process), log and save "
        "asynchronously, or spread it over ranks; wrap it in `with mon.phase('name'):` to see it "
        "by name here."
    )
