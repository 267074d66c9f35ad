"""The eddyline operator: StreamApps become pods, membership, Services and honest status.

Layers, enforced by import-linter: :mod:`.handlers` (kopf, thin) >
:mod:`.reconcile` (pure: spec and observations in, desired objects and status
out) and :mod:`.client` (the only code that talks to the Kubernetes API).
:mod:`.crd` generates the CRD from the runtime's pydantic model.

``kopf run -m eddyline_operator`` imports this package: when kopf is the one
importing, the handlers are registered. Anything else (the CRD generator, unit
tests of the reconcile functions) imports submodules without kopf.
"""

import sys

if "kopf" in sys.modules:  # imported by `kopf run -m eddyline_operator`
    from eddyline_operator import handlers as handlers
