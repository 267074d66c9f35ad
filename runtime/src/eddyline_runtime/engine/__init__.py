"""The engine: runs a topology's tasks on stream threads against a log.

From the top down (an import contract layers these modules):

* ``instance``: :class:`~eddyline_runtime.engine.instance.StreamsInstance`
  resolves a topology against a log, assigns tasks and runs them on threads;
* ``stream_thread``: one thread's loop, the assignment hand-over and the
  order of the commit steps (its module docstring says why a crash loses nothing);
* ``task_manager`` (creating, fencing, restoring and closing a thread's tasks)
  with ``store_opener`` (store paths, Spark ingest, the ``restorePending``
  wait), ``record_collector`` (outputs to partitions, at-least-once sends) and
  ``thread_metrics``;
* ``task`` (an active task and its commit), ``task_topology`` (a sub-topology
  on one partition: it runs the processors its nodes' suppliers give and never
  asks what kind of operation one is), ``task_windows`` (a task's window and
  session stores), ``task_store`` and ``record_cache`` (KIP-63),
  ``partition_group`` (KIP-695), ``topics`` (physical topics and changelogs),
  ``queryable`` (what the instance tells interactive queries, KIP-535).

Standby replicas and restoration are :mod:`eddyline_runtime.restore.replay`.
What topology authors import is :mod:`eddyline_runtime.processing`.
"""
