"""The real-node tier's audit log reader: a ServiceAccount's calls as (verb, resource)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.realnode import audit


def test_calls_are_read_per_user_with_subresources_and_response_codes(tmp_path: Path) -> None:
    user = audit.service_account_user("ns", "app-restore")
    events = [
        {"user": {"username": user}, "verb": "create", "objectRef": {"resource": "pods"},
         "responseStatus": {"code": 201}},
        {"user": {"username": user}, "verb": "create", "objectRef": {"resource": "pods"},
         "responseStatus": {"code": 422}},
        {"user": {"username": user}, "verb": "get",
         "objectRef": {"resource": "pods", "subresource": "log"}, "responseStatus": {"code": 200}},
        {"user": {"username": "system:serviceaccount:kube-system:coredns"}, "verb": "watch",
         "objectRef": {"resource": "endpointslices"}, "responseStatus": {"code": 200}},
    ]  # fmt: skip
    log = tmp_path / "audit.log"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert audit.calls_by(log, user) == {
        ("create", "pods"): {201, 422},
        ("get", "pods/log"): {200},
    }
    assert audit.calls_by(tmp_path / "none.log", user) == {}


def test_the_policy_logs_service_accounts_metadata_only(tmp_path: Path) -> None:
    policy = yaml.safe_load(audit.write_policy(tmp_path).read_text())
    assert policy["rules"][0] == {"level": "Metadata", "userGroups": ["system:serviceaccounts"]}
    assert policy["rules"][-1] == {"level": "None"}
