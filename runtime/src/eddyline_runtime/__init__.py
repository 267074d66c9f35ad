"""eddyline's runtime: what each pod of a StreamApp runs.

The packages inside follow one layering, highest first (checked by ``make lint``)::

    cli > demo > runner > local_group          entry points, local replica groups
    query                                      the instance's HTTP server and the router
    engine                                     runs topologies: instance, threads, tasks, cache
    processing                                 topology authoring (DSL, Processor API, loader)
                                               and every DSL operator (processing.operators)
    restore                                    replay (the one replay-start rule), spark, ingest
    state | log                                stores and state on disk | the log port, adapters
    membership > spec | assignor               the published membership, the StreamApp model,
                                               the pure assignor
    config | metrics | partitions | serde      leaves; also key_ranges and
                                               value_and_timestamp, below the stores
                                               and the operators both

Topology authors import from :mod:`eddyline_runtime.processing`; the operator
imports only ``spec``, ``config``, ``assignor`` and ``membership``.
"""

__version__ = "0.1.0"
