"""Presentation: engine results rendered as the JSON objects the API serves (DESIGN §6)."""
