"""e2e fixtures: a real API server from KUBECONFIG (e2e/cluster.sh up, or kind via e2e/kind.sh)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from e2e.kube import ROOT, OperatorProcess, kubectl


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def cluster():
    if not os.environ.get("KUBECONFIG"):
        pytest.fail("e2e tests need a cluster: run `e2e/cluster.sh up` and export KUBECONFIG=.flotilla/kubeconfig "
                    "(or use e2e/kind.sh)")
    r = kubectl("get", "--raw", "/readyz", check=False)
    if r.returncode != 0:
        pytest.fail(f"the API server from KUBECONFIG={os.environ['KUBECONFIG']} is not ready: {r.stderr.strip()}")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    # The Gateway API Inference Extension's CRDs (pinned, from its Go module): ServingDeployments get an
    # InferencePool, which the API server validates against the real schema.
    inference = subprocess.run([str(ROOT / "e2e" / "build-binaries.sh"), "crds"], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1]
    kubectl("apply", "--server-side", "--force-conflicts", "-f", inference)
    kubectl("wait", "--for", "condition=established", "--timeout=60s",
            "crd/trainingjobs.flotilla.dev", "crd/servingdeployments.flotilla.dev",
            "crd/inferencepools.inference.networking.k8s.io")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    d = Path(os.environ.get("FLOTILLA_E2E_LOGS") or tmp_path_factory.mktemp("e2e-logs"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def operator(log_dir, request):
    """The operator for one test module; a module sets OPERATOR_ARGS to choose e.g. its policy."""
    args = getattr(request.module, "OPERATOR_ARGS", ())
    op = OperatorProcess(log_dir / f"operator-{request.module.__name__.split('.')[-1]}.log", *args).start()
    yield op
    op.stop()


@pytest.fixture
def namespace():
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
