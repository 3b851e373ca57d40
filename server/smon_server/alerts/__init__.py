"""Alerts: rules over the stored analyses, an incident lifecycle kept in the database."""
