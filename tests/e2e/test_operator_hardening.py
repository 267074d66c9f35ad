"""The operator meets objects it does not own and careless manifests (issue 23, items 4, 8
and 11) on the real control plane with the real ``kubectl``.

* an object that holds a name the app wants and is not the app's is left untouched, and the
  app says so (``Degraded``/``NameConflict``, naming the object) until it is gone;
* ``kubectl scale --replicas=0`` suspends the app (the scale subresource, as an HPA or KEDA
  would);
* (issue 38) nothing that names such an object is applied or kept: no StatefulSet whose pods
  would run as a foreign ServiceAccount, no RoleBinding handing the executor role to one
  (``kubectl auth can-i`` stays "no");
* (issue 38) children the spec no longer asks for are pruned: ``spec.restore`` back to
  ``Never`` removes the restore ServiceAccount, its RoleBinding and (``whenDeleted: Delete``)
  its claim.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.control_plane.client import wait_until
from tests.support.control_plane.operator import Kubectl, Operator
from tests.support.control_plane.operator_fixture import operator_fixture

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "wordcount" / "streamapp.cluster.yaml"
NAMESPACE = "hardening-real"


def manifest(name: str, **spec: Any) -> str:
    document: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    document = copy.deepcopy(document)
    document["metadata"]["name"] = name
    document["spec"].update(spec)
    return yaml.safe_dump(document)


operator = operator_fixture(NAMESPACE, directory="hardening")


@pytest.fixture
def kubectl(operator: Operator) -> Kubectl:
    return operator.kubectl


def degraded(operator: Operator, app: str) -> dict[str, Any] | None:
    found = operator.condition(app, "Degraded")
    return found if found is not None and found["status"] == "True" else None


def test_an_object_of_another_owner_is_never_adopted_and_the_conflict_is_reported(
    operator: Operator, kubectl: Kubectl
) -> None:
    theirs_manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "victim-config"},
        "data": {"mine": "yes"},
    }
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(theirs_manifest))
    kubectl("apply", "-f", "-", stdin=manifest("victim", suspend=True))
    condition = wait_until(lambda: degraded(operator, "victim"), "Degraded for the conflict", 60)
    assert condition["reason"] == "NameConflict", condition
    assert "ConfigMap victim-config" in condition["message"]
    app = operator.app("victim")
    assert condition["observedGeneration"] == app["metadata"]["generation"]
    assert app["status"]["phase"] == "Suspended"  # Suspended stays; the condition says why
    theirs = operator.get("", "configmaps", "victim-config")
    assert theirs is not None
    assert theirs["data"] == {"mine": "yes"} and not theirs["metadata"].get("ownerReferences")
    # What names nothing foreign is applied; the StatefulSet's pods would mount theirs.
    assert operator.get("", "services", "victim-query") is not None
    assert operator.get("apps", "statefulsets", "victim") is None
    assert "StatefulSet victim not applied" in condition["message"]
    warnings = [e for e in operator.objects("", "events") if e.get("reason") == "NameConflict"]
    assert warnings and "ConfigMap victim-config" in warnings[0]["message"]
    assert warnings[0]["type"] == "Warning"

    kubectl("delete", "configmap", "victim-config")

    def resolved() -> bool:
        config = operator.get("", "configmaps", "victim-config")
        owners = (config or {}).get("metadata", {}).get("ownerReferences") or []
        return degraded(operator, "victim") is None and [o["uid"] for o in owners] == [
            app["metadata"]["uid"]
        ]

    wait_until(resolved, "the app's own ConfigMap and Degraded cleared", 60)
    assert operator.get("apps", "statefulsets", "victim") is not None
    kubectl("delete", "sapp", "victim")


def test_scaling_to_zero_through_the_scale_subresource_suspends_the_app(
    operator: Operator, kubectl: Kubectl
) -> None:
    kubectl("apply", "-f", "-", stdin=manifest("scaled", replicas=1))
    wait_until(lambda: operator.get("apps", "statefulsets", "scaled"), "the StatefulSet", 60)
    assert "scaled" in kubectl("scale", "sapp", "scaled", "--replicas=0")

    def suspended() -> bool:
        sts = operator.get("apps", "statefulsets", "scaled")
        ready = operator.condition("scaled", "Ready")
        return bool(
            sts is not None
            and sts["spec"]["replicas"] == 0
            and operator.app("scaled").get("status", {}).get("phase") == "Suspended"
            and ready is not None
            and "spec.replicas is 0" in ready["message"]
        )

    wait_until(suspended, "Suspended with the StatefulSet at 0", 60)
    wait_until(lambda: not operator.pods("scaled"), "no pods left", 120)
    kubectl("delete", "sapp", "scaled")


K8S_RESTORE = {"when": "Always", "master": "k8s://https://kubernetes.default.svc"}


def foreign_account(kubectl: Kubectl, name: str) -> None:
    """A ServiceAccount a platform team made, of a name an app will want."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(account))


def can_create_pods(kubectl: Kubectl, account: str) -> str:
    as_ = f"--as=system:serviceaccount:{NAMESPACE}:{account}"
    return kubectl.run("auth", "can-i", "create", "pods", as_).stdout.strip()


def test_children_that_name_a_foreign_account_are_not_applied(
    operator: Operator, kubectl: Kubectl
) -> None:
    """Issue 38: before, the StatefulSet ran its pods as the foreign runtime account and the
    restore RoleBinding handed the executor role to the foreign restore account."""
    foreign_account(kubectl, "guard-runtime")
    foreign_account(kubectl, "guard-restore")
    assert can_create_pods(kubectl, "guard-restore") == "no"
    spec = {"suspend": True, "restore": K8S_RESTORE}
    kubectl("apply", "-f", "-", stdin=manifest("guard", **spec))

    def withheld() -> dict[str, Any] | None:
        found = degraded(operator, "guard")
        message = (found or {}).get("message", "")
        return found if "RoleBinding guard-restore not applied" in message else None

    condition = wait_until(withheld, "Degraded naming both withheld children", 60)
    assert condition["reason"] == "NameConflict"
    assert "StatefulSet guard not applied" in condition["message"]
    assert "RoleBinding guard-membership not applied" in condition["message"]
    assert operator.get("", "configmaps", "guard-config") is not None  # names nothing foreign
    assert operator.get("apps", "statefulsets", "guard") is None
    assert operator.get("rbac.authorization.k8s.io", "rolebindings", "guard-restore") is None
    assert operator.get("rbac.authorization.k8s.io", "rolebindings", "guard-membership") is None
    assert can_create_pods(kubectl, "guard-restore") == "no"
    for account in ("guard-runtime", "guard-restore"):
        theirs = operator.get("", "serviceaccounts", account)
        assert theirs is not None and not theirs["metadata"].get("ownerReferences")
    kubectl("delete", "sapp", "guard")


def test_a_child_made_before_the_account_was_replaced_is_removed_claims_kept(
    operator: Operator, kubectl: Kubectl
) -> None:
    """The app's own account replaced by someone else's (while reconciliation was paused):
    the StatefulSet and the RoleBinding that name it go; the StatefulSet without its claims."""
    storage = {"size": "1Gi", "logSize": "1Gi", "whenDeleted": "Delete"}  # the harder case
    kubectl("apply", "-f", "-", stdin=manifest("swap", replicas=1, storage=storage))
    wait_until(lambda: operator.get("apps", "statefulsets", "swap"), "the StatefulSet", 60)
    wait_until(
        lambda: operator.get("", "persistentvolumeclaims", "state-swap-0"), "the state claim", 60
    )
    kubectl("annotate", "sapp", "swap", "eddyline.dev/pause-reconciliation=true")
    wait_until(lambda: operator.condition("swap", "Paused"), "Paused", 60)
    kubectl("delete", "serviceaccount", "swap-runtime")
    foreign_account(kubectl, "swap-runtime")
    kubectl("annotate", "sapp", "swap", "eddyline.dev/pause-reconciliation-")

    def removed() -> bool:
        return (
            operator.get("apps", "statefulsets", "swap") is None
            and operator.get("rbac.authorization.k8s.io", "rolebindings", "swap-membership") is None
            and not operator.pods("swap")
        )

    wait_until(removed, "the StatefulSet, the RoleBinding and the pods gone", 120)
    claim = operator.get("", "persistentvolumeclaims", "state-swap-0")
    assert claim is not None and claim["metadata"].get("deletionTimestamp") is None
    condition = degraded(operator, "swap")
    assert condition is not None and condition["reason"] == "NameConflict"
    # Theirs gone: the app comes back on its own claims.
    kubectl("delete", "serviceaccount", "swap-runtime")
    wait_until(lambda: operator.get("apps", "statefulsets", "swap"), "the StatefulSet back", 60)
    kubectl("delete", "sapp", "swap")


def test_restore_back_to_never_prunes_the_account_binding_and_claim(
    operator: Operator, kubectl: Kubectl
) -> None:
    spec: dict[str, Any] = {
        "suspend": True,
        "restore": K8S_RESTORE,
        "storage": {"size": "1Gi", "logSize": "1Gi", "whenDeleted": "Delete"},
    }
    kubectl("apply", "-f", "-", stdin=manifest("shed", **spec))
    made = [
        ("", "serviceaccounts", "shed-restore"),
        ("rbac.authorization.k8s.io", "rolebindings", "shed-restore"),
        ("", "persistentvolumeclaims", "shed-restore"),
    ]
    wait_until(lambda: all(operator.get(*m) for m in made), "the restore children", 60)
    assert can_create_pods(kubectl, "shed-restore") == "yes"
    kubectl("patch", "sapp", "shed", "--type=merge", "-p", '{"spec":{"restore":{"when":"Never"}}}')

    def pruned() -> bool:
        for found in (operator.get(*m) for m in made):
            if found is not None and found["metadata"].get("deletionTimestamp") is None:
                return False
        return True

    wait_until(pruned, "the restore children pruned", 60)
    assert can_create_pods(kubectl, "shed-restore") == "no"
    assert operator.get("", "serviceaccounts", "shed-runtime") is not None
    assert operator.get("", "persistentvolumeclaims", "shed-log") is not None
    events = [e["message"] for e in operator.objects("", "events") if e.get("reason") == "Pruned"]
    assert "deleted RoleBinding shed-restore: the spec no longer asks for it" in events
    kubectl("delete", "sapp", "shed")


def test_pods_a_quota_refuses_make_the_app_degraded_with_the_controllers_message(
    operator: Operator, kubectl: Kubectl
) -> None:
    """Issue 38: a quota that needs requests refused every pod, and the app said
    Progressing with Degraded=False while the controller recorded FailedCreate."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "needs-requests"},
        "spec": {"hard": {"requests.cpu": "8"}},
    }
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(quota))
    try:
        kubectl("apply", "-f", "-", stdin=manifest("quota", replicas=1))

        def refused() -> dict[str, Any] | None:
            found = degraded(operator, "quota")
            return found if (found or {}).get("reason") == "PodCreateFailed" else None

        condition = wait_until(refused, "Degraded, PodCreateFailed", 90)
        assert condition["message"].startswith("the StatefulSet controller cannot create pods:")
        assert "must specify requests.cpu" in condition["message"], condition["message"]
        assert operator.app("quota")["status"]["phase"] == "Degraded"
        assert not operator.pods("quota")
        warnings = [
            e
            for e in operator.objects("", "events")
            if e.get("reason") == "PodCreateFailed"
            and e["involvedObject"].get("kind") == "StreamApp"
        ]
        assert warnings and warnings[0]["type"] == "Warning"
        assert "must specify requests.cpu" in warnings[0]["message"]
    finally:
        kubectl("delete", "resourcequota", "needs-requests", "--ignore-not-found")
    kubectl("delete", "sapp", "quota")


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"requests": {"nvidia.com/gpu": "1"}}, "needs a limit equal to it"),
        ({"limits": {"example.com/fpga": "500m"}}, "takes a whole number such as 1"),
        ({"limits": {"hugepages-2Mi": "64Mi"}}, "hugepages-<size> needs a cpu or memory"),
    ],
)
def test_resources_no_pod_can_have_are_refused_at_admission(
    operator: Operator, kubectl: Kubectl, resources: dict[str, Any], words: str
) -> None:
    """Issue 38: the real API server's CEL (with its quantity() library) refuses them, naming
    the field, before any StatefulSet meets them."""
    result = kubectl.run("apply", "-f", "-", stdin=manifest("sized", resources=resources))
    assert result.returncode != 0, result.stdout
    assert "spec.resources" in result.stderr and words in result.stderr, result.stderr
    fine = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1", "cpu": "1"}}
    kubectl("apply", "--dry-run=server", "-f", "-", stdin=manifest("sized", resources=fine))


def executor_binding(name: str, subject: str, owner: str | None, role: str) -> str:
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": NAMESPACE}],
    }
    if owner is not None:
        binding["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "eddyline.dev/v1alpha1",
                "kind": "StreamApp",
                "name": owner,
                "uid": "0b7d6c1e-0000-4000-8000-000000000000",
                "controller": True,
            }
        ]
    return yaml.safe_dump(binding)


def test_the_operator_binds_the_executor_role_only_to_an_apps_restore_account(
    operator: Operator, kubectl: Kubectl
) -> None:
    """Issue 38, option (a): the chart's ValidatingAdmissionPolicy. Server-side dry runs as
    the operator's ServiceAccount: before it, binding the executor role to the operator's
    own account was allowed (it could then create pods)."""
    role = next(
        o["metadata"]["name"]
        for o in operator.rendered
        if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-restore-executor")
    )
    as_operator = f"--as=system:serviceaccount:{NAMESPACE}:{operator.service_account}"

    def dry_run(document: str) -> str:
        result = kubectl.run("create", "--dry-run=server", as_operator, "-f", "-", stdin=document)
        return "allowed" if result.returncode == 0 else result.stderr

    own = executor_binding("grab", operator.service_account, None, role)
    refused = dry_run(own)
    assert "ValidatingAdmissionPolicy" in refused and "named <app>-restore" in refused, refused
    assert dry_run(executor_binding("app-restore", "app-restore", "app", role)) == "allowed"
    other = executor_binding("app-restore", "someone", "app", role)
    assert "only to the app's restore ServiceAccount" in dry_run(other)
    # Only the executor role is looked at: a binding of another role is RBAC's business.
    edit = executor_binding("grab", operator.service_account, None, "edit")
    assert "ValidatingAdmissionPolicy" not in dry_run(edit)
