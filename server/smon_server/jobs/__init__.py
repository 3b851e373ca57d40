"""Live jobs: where the what-if engine meets the store (liveness, one job's analysis, the loop)."""
