"""The endpoint picker's identity, shared by what renders it (plan/gateway.py) and what trusts a
stored release record (cluster/record_trust.py): the one pod of a release that runs with an API
token, and the only grants that token may carry."""

from __future__ import annotations

from typing import Any

PICKER_SUFFIX = "-epp"
"""The picker's Deployment, Service, ServiceAccount, Role and RoleBinding: <pool><suffix>, and
<release><suffix> for the account the pools' pickers share."""
PICKER_CLUSTER_ROLE = "kimideploy-endpoint-picker"
"""The ClusterRole k8s/base/rbac.yaml ships with PICKER_RULES; each release binds it to its
pickers' account in its namespace (a RoleBinding grants it there only). Shipped rather than
rendered as a Role: a user's server-side dry run of a RoleBinding must find the role it binds."""
PICKER_RULES: list[dict[str, Any]] = [
    # What the picker's controllers watch (pkg/lwepp/controller: Pods and its InferencePool).
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["inference.networking.k8s.io"],
        "resources": ["inferencepools"],
        "verbs": ["get", "list", "watch"],
    },
]


def picker_account(release: str) -> str:
    return f"{release}{PICKER_SUFFIX}"
