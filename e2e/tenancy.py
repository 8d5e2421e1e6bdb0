"""Hostile-tenant fixtures for the e2e suite: the product's normal shape, as an attacker sees it.

A platform team installs the chart once; application teams write CacheScalingPolicies in
their own namespaces, so a policy author is untrusted. :func:`tenancy` makes that world on
the session's API server for one test:

- two namespaces, ``tenant-a-<id>`` and ``tenant-b-<id>`` (fresh names per test, deleted
  afterwards without waiting);
- a tenant user, ``alice``, bound in tenant-a only to a Role that may create, get, list,
  watch and delete CacheScalingPolicies and nothing else; the tests act as her through the
  API server's impersonation (``kubectl --as alice``, :meth:`Tenancy.as_tenant`), so every
  request she makes is authorized by the real RBAC evaluator;
- the operator as the chart's ServiceAccount (:func:`tenant_operator`): a TokenRequest
  token of the session release's account, the chart's own ``cachescale run`` flags read
  from its installed Deployment, scoped with ``--namespace`` to the two tenants so that it
  never touches another test's policies (the rights it holds are still the chart's,
  cluster-wide).

:func:`account_can_i` asks the API server (``kubectl auth can-i``, a
SelfSubjectAccessReview) what a kubeconfig's subject may do; :func:`grant_enforce`
applies the Role and RoleBinding the chart renders for ``rbac.enforceNamespaces``, as
test_credentials_opt_in.py's ``grant_secret`` does for ``rbac.prometheusSecrets``, so a
test can let one namespace be patched without a helm upgrade of the session release.

Use from a test module by importing the fixture (pytest finds it by name)::

    from e2e.tenancy import Tenancy, tenancy  # noqa: F401 (a fixture)
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.cluster import Cluster
from e2e.harness.release import CHART, Release
from e2e.kube_helpers import apply, get
from e2e.operators import chart_flags, operator_process
from tests.controller.process_fixture import OperatorProcess

TENANT_USER = "alice"
"""The tenant: a plain user name, authenticated by impersonation (the admin may impersonate)."""
AUTHOR_ROLE = "cachescalingpolicy-author"
AUTHOR_VERBS = ("create", "get", "list", "watch", "delete")
"""What a policy author is given in their own namespace: policies, and nothing else."""


@dataclass(frozen=True)
class Tenancy:
    """Two tenants' namespaces and the user who may write policies in the first only."""

    cluster: Cluster
    a: str
    """tenant-a: where ``user`` may write policies."""
    b: str
    """tenant-b: another team's namespace ``user`` has no rights in."""
    user: str = TENANT_USER

    def as_tenant(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``kubectl --as <user> ARGS``: the API server authorizes it as the tenant."""
        return self.cluster.kubectl("--as", self.user, *args, stdin=stdin)

    def tenant_can_i(self, verb: str, resource: str, namespace: str) -> bool:
        """Whether the API server lets the tenant ``verb`` ``resource`` in ``namespace``."""
        return _allowed(self.as_tenant("auth", "can-i", verb, resource, "-n", namespace))

    def apply_as_tenant(
        self, namespace: str, obj: dict[str, Any]
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl create`` one object as the tenant (create: she has no patch)."""
        return self.as_tenant("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj))


def _allowed(answer: subprocess.CompletedProcess[str]) -> bool:
    """``kubectl auth can-i``'s answer: "yes" (exit 0) or "no" (exit 1); anything else
    (an error talking to the server) fails the test rather than reading as "no"."""
    said = answer.stdout.strip()
    assert said in ("yes", "no"), (answer.stdout, answer.stderr)
    return said == "yes"


def author_role(namespace: str, user: str) -> list[dict[str, Any]]:
    """The Role and RoleBinding that make ``user`` a policy author in ``namespace``."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": AUTHOR_ROLE, "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["cachescale.dev"],
                "resources": ["cachescalingpolicies"],
                "verbs": list(AUTHOR_VERBS),
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{AUTHOR_ROLE}-{user}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AUTHOR_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    return [role, binding]


@pytest.fixture
def tenancy(cluster: Cluster) -> Iterator[Tenancy]:
    """tenant-a and tenant-b (fresh names), ``alice`` a policy author in tenant-a only."""
    suffix = uuid.uuid4().hex[:6]
    world = Tenancy(cluster, f"tenant-a-{suffix}", f"tenant-b-{suffix}")
    try:
        for name in (world.a, world.b):
            created = cluster.kubectl("create", "namespace", name)
            assert created.returncode == 0, created.stderr
        for obj in author_role(world.a, world.user):
            apply(cluster, world.a, obj)
        yield world
    finally:
        cluster.kubectl("delete", "namespace", world.a, world.b, "--wait=false")


def operator_kubeconfig(cluster: Cluster, release: Release, workdir: Path) -> Path:
    """A kubeconfig authenticating as the chart's ServiceAccount (a TokenRequest token)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return cluster.token_kubeconfig(
        workdir / "operator.kubeconfig", release.namespace, release.service_account
    )


def account_can_i(
    cluster: Cluster, kubeconfig: Path, verb: str, resource: str, namespace: str
) -> bool:
    """Whether the subject of ``kubeconfig`` may ``verb`` ``resource`` in ``namespace``,
    as the API server answers its own SelfSubjectAccessReview."""
    answer = cluster.kubectl(
        "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, resource, "-n", namespace
    )
    return _allowed(answer)


@contextmanager
def tenant_operator(
    cluster: Cluster,
    release: Release,
    workdir: Path,
    world: Tenancy,
    flags: tuple[str, ...] = (),
) -> Iterator[OperatorProcess]:
    """``cachescale run`` as the chart's ServiceAccount with the chart's flags (plus
    ``flags``), serving the two tenants' namespaces; stopped on the way out."""
    kubeconfig = operator_kubeconfig(cluster, release, workdir)
    installed = get(cluster, "deployment", release.name, "-n", release.namespace)
    assert installed is not None, "the session release's Deployment"
    with operator_process(
        workdir / "operator",
        kubeconfig,
        (world.a, world.b),
        flags=(*chart_flags(installed), *flags),
    ) as operator:
        yield operator


def grant_enforce(cluster: Cluster, release: Release, namespace: str) -> None:
    """Apply the Role and RoleBinding the chart renders for
    ``rbac.enforceNamespaces=[namespace]`` (patch on the targets there), as a cluster
    owner's ``helm upgrade`` would create them."""
    rendered = cluster.helm(
        "template", release.name, str(CHART), "-n", release.namespace,
        "--show-only", "templates/rbac.yaml",
        "--set-json", f'rbac.enforceNamespaces=["{namespace}"]',
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    applied = 0
    for doc in yaml.safe_load_all(rendered.stdout):
        if doc and doc["kind"] in ("Role", "RoleBinding"):
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]
            apply(cluster, namespace, doc)
            applied += 1
    assert applied == 2, "the chart renders one Role and one RoleBinding per namespace"
