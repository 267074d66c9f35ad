"""Topologies the e2e tests run in pods that the examples do not cover (see each module)."""
