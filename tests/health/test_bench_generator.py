"""The benchmark's telemetry generator shares no code with the detectors, and speaks the sample format."""

import ast
import sys
from pathlib import Path

from flotilla.health.samples import Sample

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_generator_imports_nothing_from_flotilla():
    tree = ast.parse((BENCH / "health_gen.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and not any(name.split(".")[0] == "flotilla" for name in imported)


def test_the_generator_writes_valid_samples_with_roles_and_ranks():
    sys.path.insert(0, str(BENCH))
    try:
        from health_gen import Fleet
    finally:
        sys.path.remove(str(BENCH))
    fleet = Fleet(1, 16, 200, 0)
    samples = [Sample.from_dict(d) for _, batch in fleet.second(150) for d in batch]
    steps = [s for s in samples if s.metric == "step_time"]
    assert steps and all(s.rank is not None for s in steps)
    assert {s.role for s in samples if s.role} <= {f"pp{i}/{n}" for n in (2, 4) for i in range(n)}
