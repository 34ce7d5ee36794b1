"""All of src/flotilla type-checks clean ([tool.mypy] in pyproject): the pure packages, the glue, the worker library
and the command line."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_errors():
    # The files and the strictness are pyproject's; the cache (.mypy_cache) makes a second run a few seconds.
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout
