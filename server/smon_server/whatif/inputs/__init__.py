"""The engine's input formats: stored step records (`from_steps`, with `host_line` for phases timed
on the device), per-op trace files (`trace`), PyTorch profiler traces (`kineto`), and `merge`,
which joins op tables built apart. Each turns its format into the one `OpTable` the engine reads;
the engine itself (the modules beside this package) knows none of them."""
