"""Pure reconciliation: a StreamApp and what was observed in, desired objects and status out.

Nothing here talks to the API server or to pods, and nothing imports kopf or
kubernetes (an import contract): every function is a plain computation on
dicts and the runtime's models, unit-tested without any server.

* :mod:`.names` - object names and labels, one place.
* :mod:`.objects` - the owned objects (ConfigMap, Services, StatefulSet, PDB, RBAC, log claim).
* :mod:`.membership` - who is a member, and the assignment to publish.
* :mod:`.status` - conditions, phase, the rollout step.
* :mod:`.plan` - one cycle: spec + observed state -> a :class:`~.plan.Plan`.
"""
