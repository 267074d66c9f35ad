"""``kubectl eddyline``: the operator's view of a StreamApp, for the people who run it.

A kubectl plugin (the ``kubectl-eddyline`` program, installed with the package: kubectl
runs any ``kubectl-<name>`` on the PATH as ``kubectl <name>``). It runs on a user's machine,
where pod addresses do not route, so everything it reads goes through the API server: the
StreamApp, its pods and membership ConfigMap, and each pod's ``/v1/layout`` and store
metadata through the pod proxy (the ``pods/proxy`` subresource; docs/operator.md, section
"kubectl eddyline", lists the rights it needs).

Layers, highest first (an import contract holds them): :mod:`.cli` (arguments, the one
``error:`` line) > :mod:`.commands` (each subcommand's reads and writes, through the
operator's :mod:`~eddyline_operator.client`) > :mod:`.render` (text for a terminal or a
log) > :mod:`.status_view` (pure: the objects read in, one typed view out, and its JSON).
"""
