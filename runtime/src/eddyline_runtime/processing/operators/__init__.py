"""Every processor the DSL builds, by kind: one home, one way in.

The DSL (:mod:`~eddyline_runtime.processing.dsl`) only adds nodes; each node's
processor comes from here, built by the supplier the DSL attaches (one
instance per task, as every Processor API processor), and reaches its stores
through the typed interfaces of :mod:`.stores`. The engine runs whatever
processor a node's supplier gives and never asks what kind of operation it is.

* :mod:`.stream_steps`: stateless steps (``map_values``, ``filter``, ``split``...);
* :mod:`.aggregations`: key-value ``count``/``reduce``/``aggregate``;
* :mod:`.tables`: KTable operations and table aggregations;
* :mod:`.windowed`: time, session and sliding window aggregations;
* :mod:`.joins`: stream-stream, stream-table and table-table joins;
* :mod:`.foreign_key_joins`: foreign-key table-table joins (KIP-213);
* :mod:`.suppress`: final results (``emit_final``, ``suppress``);
* :mod:`.stores`: the store interfaces all of them use.
"""
