"""Names and labels of what the operator owns, so every layer derives them the same way."""

from __future__ import annotations

from eddyline_runtime.spec import GROUP

OPERATOR = "eddyline-operator"
CONTAINER = "eddyline"
QUERY_PORT = 7070
QUERY_PORT_NAME = "query"
# Where a pod's volumes are mounted; every path a pod uses appears in its args or env,
# so a stand-in kubelet can map them (docs/operator.md, "pod contract").
CONFIG_MOUNT = "/etc/eddyline"
STATE_MOUNT = "/var/lib/eddyline/state"
LOG_MOUNT = "/var/lib/eddyline/log"
MANIFEST_KEY = "streamapp.yaml"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_APP = f"{GROUP}/app"
LABEL_REVISION = f"{GROUP}/revision"
ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"
# Strimzi's convention: "true" pauses reconciliation (the operator records Paused and
# changes nothing) until the annotation is removed or set to anything else.
ANNOTATION_PAUSE = f"{GROUP}/pause-reconciliation"
NODE_HOSTNAME = "kubernetes.io/hostname"
# The pods' argument that names the membership ConfigMap they watch (references.py reads it).
MEMBERSHIP_FLAG = "--membership-configmap"


# Every child's name is the app's name and a suffix that no other child of the same kind
# ends with (the StatefulSet and the PDB take the bare name, one per app): two apps'
# children then never share a name. The runtime ServiceAccount once took the bare name,
# so app "x-restore"'s account was app "x"'s restore account.
def runtime_account(app: str) -> str:
    return f"{app}-runtime"


def config_map(app: str) -> str:
    return f"{app}-config"


def membership_map(app: str) -> str:
    return f"{app}-membership"


def headless_service(app: str) -> str:
    return f"{app}-headless"


def query_service(app: str) -> str:
    return f"{app}-query"


def log_claim(app: str) -> str:
    return f"{app}-log"


def selector_labels(app: str) -> dict[str, str]:
    """What the StatefulSet, Services and PDB select pods by (never changes for an app)."""
    return {LABEL_NAME: "eddyline", LABEL_INSTANCE: app}


def labels(app: str, component: str) -> dict[str, str]:
    return {
        **selector_labels(app),
        LABEL_MANAGED_BY: OPERATOR,
        LABEL_COMPONENT: component,
        LABEL_APP: app,
    }


def selector_string(app: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(app).items()))
