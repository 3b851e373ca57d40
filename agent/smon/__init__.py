"""SMon agent: `smon.attach(...)` inside every training rank (placeholder until the agent lands)."""
