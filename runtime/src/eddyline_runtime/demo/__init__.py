"""Demonstrations run by ``make run``: real stores, real processes, readable output."""
