"""The engine's input formats: stored step records (`from_steps`, with `host_line` for phases timed
on the device; `step_table` converts a chunk of them for the live window), per-op trace files
(`trace`), PyTorch profiler traces (`kineto`), and `merge`, which joins op tables built apart.
Each turns its format into the one `OpTable` the engine reads; the engine itself (the modules
beside this package) knows none of them."""
