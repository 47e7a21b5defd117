"""Stages: a federation that lives on, with joins, leaves and requests over time."""
