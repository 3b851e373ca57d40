"""What tests and benchmarks share: builders of data, servers in processes, databases, fakes of
outside programs. Fixtures stay in conftest.py files; plain helpers live here, so a benchmark
imports them without importing pytest's conftest."""
