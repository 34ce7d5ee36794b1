"""Malformed custom resources are refused by the API server, with the field named."""

from __future__ import annotations

import json

import pytest

from e2e.kube import apply, kubectl

GOOD_TJ = {
    "apiVersion": "flotilla.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "tj"},
    "spec": {
        "deadlineSeconds": 3600,
        "totalSteps": 100,
        "elasticity": {"minGPUs": 1, "maxGPUs": 2},
        "throughput": [{"gpus": 1, "stepsPerSecond": 1.0}],
        "template": {"spec": {"containers": [{"name": "w", "image": "busybox"}]}},
    },
}

GOOD_SD = {
    "apiVersion": "flotilla.dev/v1alpha1",
    "kind": "ServingDeployment",
    "metadata": {"name": "sd"},
    "spec": {
        "slo": {"ttftMs": 400, "tpotMs": 50, "attainment": 0.9},
        "workload": {"requestsPerSecond": 2, "inputTokens": 512, "outputTokens": 128},
        "maxGPUs": 4,
        "profile": {"name": "opt-13b-a100"},
        "prefill": {"template": {"spec": {"containers": [{"name": "p", "image": "vllm"}]}}},
        "decode": {"template": {"spec": {"containers": [{"name": "d", "image": "vllm"}]}}},
    },
}


def _mutate(base: dict, path: str, value) -> dict:
    obj = json.loads(json.dumps(base))
    *parents, leaf = path.split(".")
    node = obj
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return obj


_DELETE = object()

CASES = [
    # (id, object, words the API server's message must contain)
    ("missing-deadline", _mutate(GOOD_TJ, "spec.deadlineSeconds", _DELETE),
     ["spec", "exactly one of spec.deadline and spec.deadlineSeconds"]),
    ("both-deadlines", _mutate(GOOD_TJ, "spec.deadline", "2030-01-01T00:00:00Z"),
     ["exactly one of spec.deadline and spec.deadlineSeconds"]),
    ("min-above-max", _mutate(GOOD_TJ, "spec.elasticity", {"minGPUs": 8, "maxGPUs": 4}),
     ["spec.elasticity.minGPUs", "must be <= spec.elasticity.maxGPUs"]),
    ("negative-steps", _mutate(GOOD_TJ, "spec.totalSteps", -5), ["spec.totalSteps", "greater than or equal to 1"]),
    ("wrong-type-steps", _mutate(GOOD_TJ, "spec.totalSteps", "many"), ["spec.totalSteps", "integer"]),
    ("bad-deadline-format", _mutate(GOOD_TJ, "spec.deadlineSeconds", "tomorrow"), ["spec.deadlineSeconds"]),
    ("empty-curve", _mutate(GOOD_TJ, "spec.throughput", []), ["spec.throughput", "at least 1"]),
    ("workers-not-whole", _mutate(GOOD_TJ, "spec.elasticity", {"minGPUs": 3, "maxGPUs": 8, "gpusPerWorker": 2}),
     ["spec.elasticity.minGPUs", "multiple of gpusPerWorker"]),
    ("no-containers", _mutate(GOOD_TJ, "spec.template", {"spec": {"containers": []}}),
     ["spec.template.spec.containers"]),
    ("zero-pipeline-stages", _mutate(GOOD_TJ, "spec.parallelism", {"pipelineStages": 0}),
     ["spec.parallelism.pipelineStages", "greater than or equal to 1"]),
    ("more-stages-than-workers", _mutate(GOOD_TJ, "spec.parallelism", {"pipelineStages": 2}),
     ["spec.parallelism.pipelineStages", "must be at most the number of workers at spec.elasticity.minGPUs"]),
    ("relative-file-checkpoint", _mutate(GOOD_TJ, "spec.checkpoint", {"uri": "file://ckpt/j"}),
     ["spec.checkpoint.uri", "absolute path"]),
    ("pvc-checkpoint-without-claim", _mutate(GOOD_TJ, "spec.checkpoint", {"uri": "pvc:///dir"}),
     ["spec.checkpoint.uri", "claim name"]),
    ("bad-slo-attainment", _mutate(GOOD_SD, "spec.slo", {"ttftMs": 400, "tpotMs": 50, "attainment": 1.5}),
     ["spec.slo.attainment", "less than or equal to 1"]),
    ("bad-slo-negative-ttft", _mutate(GOOD_SD, "spec.slo", {"ttftMs": -1, "tpotMs": 50}), ["spec.slo.ttftMs"]),
    ("fixed-without-replicas", _mutate(GOOD_SD, "spec.planner", {"mode": "fixed"}),
     ["spec.planner", "required when mode is fixed"]),
    ("auto-without-profile", _mutate(GOOD_SD, "spec.profile", _DELETE),
     ["spec.profile is required unless spec.planner.mode is fixed"]),
    ("profile-half-coefficients", _mutate(GOOD_SD, "spec.profile", {"prefill": [{"gpus": 1}]}),
     ["spec.profile"]),
    ("unknown-planner-mode", _mutate(GOOD_SD, "spec.planner", {"mode": "yolo"}),
     ["spec.planner.mode", "Unsupported value"]),
]


@pytest.mark.parametrize("obj,words", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_object_is_refused_naming_the_field(namespace, obj, words):
    result = apply(json.dumps(obj), namespace)
    assert result.returncode != 0, f"the API server accepted a malformed object: {result.stdout}"
    for w in words:
        assert w in result.stderr, f"{w!r} not in: {result.stderr}"


def test_good_objects_are_accepted(namespace):
    piped = _mutate(_mutate(GOOD_TJ, "spec.parallelism", {"pipelineStages": 2}), "metadata.name", "piped")
    for obj in (GOOD_TJ, GOOD_SD, _mutate(piped, "spec.elasticity", {"minGPUs": 4, "maxGPUs": 8, "gpusPerWorker": 2})):
        result = apply(json.dumps(obj), namespace)
        assert result.returncode == 0, result.stderr


def test_unknown_phase_in_status_is_refused(namespace):
    assert apply(json.dumps(GOOD_TJ), namespace).returncode == 0
    result = kubectl("patch", "trainingjob", "tj", "-n", namespace, "--subresource=status", "--type=merge",
                     "-p", '{"status": {"phase": "Exploded"}}', check=False)
    assert result.returncode != 0
    assert "status.phase" in result.stderr and "Unsupported value" in result.stderr, result.stderr
