"""eddyline's tests: a package, so helpers are imported as ``tests.support.<module>``."""
