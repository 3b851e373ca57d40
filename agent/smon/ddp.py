"""DistributedDataParallel: which forwards all-reduce their gradients (the timing is in hooks.py).

DDP all-reduces gradient buckets while backward is still computing; only the part of that
communication that backward could not hide delays the step. SMon's `grad_sync` is that *exposed*
wait: from the end of the backward graph (where DDP's reducer itself records the end of backward
compute, right before its `finalize_backward`) until `finalize_backward` returns, having waited for
the last bucket's all-reduce and written the averaged gradients back. Both ends are autograd-engine
final callbacks queued around DDP's own (hooks.py), so SMon registers no comm hook and runs no
Python in the reduction path: a Python comm hook costs a GIL round trip per bucket on the process
group's thread (+3-5% step time for torch's own `allreduce_hook` on a 20 ms gloo step here). A
user's comm hook, registered before or after attach, is left alone and its time is part of
`grad_sync`.
"""

from __future__ import annotations

from typing import Any


def is_ddp(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:
        return False
    return isinstance(module, DistributedDataParallel)


# DDP decides in forward whether the backward will all-reduce (`torch.is_grad_enabled() and
# require_backward_grad_sync`; False under `no_sync()`); a training forward has grad enabled, so
# this flag is what is left to read. `ModelHooks.end` reads it inline on every forward.
SYNC_FLAG = "require_backward_grad_sync"
