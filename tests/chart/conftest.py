from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "flotilla"


@pytest.fixture(scope="session")
def helm() -> str:
    path = shutil.which("helm")
    if not path:
        pytest.skip("helm is not on PATH: `export PATH=$(e2e/cluster.sh bin):$PATH` (scripts/test.sh does)")
    return path


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="session")
def render(helm):
    """render(*--set/--values args) -> {(kind, name): object} of `helm template`."""

    def _render(*args: str) -> dict[tuple[str, str], dict]:
        r = run_helm(helm, "template", "rel", str(CHART), "--namespace", "flotilla-system", *args)
        assert r.returncode == 0, r.stderr
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        assert len(objects) == len(docs), "two objects with the same kind and name"
        return objects

    return _render
