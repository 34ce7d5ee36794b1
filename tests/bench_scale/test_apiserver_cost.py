"""bench/apiserver_cost.py's CRD variant: the TrainingJob CRD without its validation rules, nothing else changed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import apiserver_cost  # noqa: E402


def test_the_crd_without_rules_loses_every_rule_and_nothing_else():
    crd = yaml.safe_load((ROOT / "crds" / "trainingjobs.flotilla.dev.yaml").read_text())
    text = json.dumps(crd)
    assert text.count("x-kubernetes-validations") >= 4  # the rules the e2e malformed-input tests rely on
    stripped = apiserver_cost.without_rules(crd)
    assert "x-kubernetes-validations" not in json.dumps(stripped)
    assert "x-kubernetes-validations" in json.dumps(crd)  # the original is left as it was
    schema = stripped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["required"] == ["totalSteps", "elasticity", "throughput", "template"]
    assert len(json.dumps(stripped)) < len(text)
