"""The agent's version, sent in Coordinates.agent_version."""

__version__ = "0.1.0"
