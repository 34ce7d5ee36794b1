"""The pure decision packages, the resources' typed parse and the operator's planning modules must not import
Kubernetes, HTTP, SQL or glue code."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout, result.stdout


def test_every_pure_package_is_under_the_contract():
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    pure = contracts[0]["source_modules"]
    for package in ("flotilla.allocation", "flotilla.serving", "flotilla.pool", "flotilla.health", "flotilla.tenancy"):
        assert package in pure, package
