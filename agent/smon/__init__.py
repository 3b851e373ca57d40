"""SMon agent: `mon = smon.attach(model=..., optimizer=..., dataloader=...)` inside every training rank.

Importing this package pulls in grpcio and protobuf only; torch and pynvml are imported when
attach is given torch objects and when the GPU sampler thread starts.
"""

from smon._version import __version__
from smon.api import attach
from smon.monitor import Monitor

__all__ = ["Monitor", "__version__", "attach"]
