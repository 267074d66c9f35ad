"""Pure reconciliation: a StreamApp and what was observed in, desired objects and status out.

Nothing here talks to the API server or to pods, and nothing imports kopf or
kubernetes (an import contract): every function is a plain computation on
dicts and the runtime's models, unit-tested without any server.

* :mod:`.names` - object names and labels, one place.
* :mod:`.objects` - the owned objects (ConfigMap, Services, StatefulSet, PDB, RBAC, log claim).
* :mod:`.membership` - who is a member, and the assignment to publish.
* :mod:`.status` - what the pods say, and the rolling restart's next step.
* :mod:`.rollout` - which pods a cycle restarts: the upgrade's step or the rolling restart.
* :mod:`.log_node` - pinning the embedded sqlite log's pods to one node.
* :mod:`.upgrade` - full-cluster topology upgrades, a state machine over status.
* :mod:`.restore_job` - Spark restore Jobs: when, what, and how they went.
* :mod:`.conditions` - Ready, Progressing, Degraded, Upgrading, and the phase.
* :mod:`.status_record` - the status read once into the typed model, dumped in one place.
* :mod:`.plan` - one cycle: spec + observed state -> a :class:`~.plan.Plan` (typed status).
"""
