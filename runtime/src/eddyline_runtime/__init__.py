"""eddyline's runtime: what each pod of a StreamApp runs.

The packages inside follow one layering (checked by ``make lint``):
``cli`` > ``state`` > ``config`` / ``metrics`` / ``partitions``.
"""

__version__ = "0.1.0"
