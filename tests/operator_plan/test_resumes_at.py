"""A resized job's restore reaches the allocator's plan: JobState.resumes_at, and whether its worker set has
reported a rate yet (JobState.rate_unknown)."""

import json

from flotilla.operator import training
from flotilla.operator.timeutil import rfc3339
from tests.operator_plan.builders import T0, trainingjob

RESIZED = {"phase": "Resharding", "reshards": 2, "placement": [{"node": "n0", "gpus": 4}],
           "checkpoint": {"generation": 2, "step": 400, "restoreSeconds": 45.0},
           "progress": {"steps": 400, "stepsPerSecond": 0.0, "updatedAt": rfc3339(T0 + 600)}}


def test_a_job_just_resized_trains_again_one_restore_after_the_switch():
    assert training.job_state(trainingjob(status=RESIZED)).resumes_at == T0 + 645


def test_a_job_whose_new_workers_report_a_rate_trains_now():
    report = json.dumps({"generation": 2, "steps": 420, "stepsPerSecond": 2.5, "time": rfc3339(T0 + 700)})
    body = trainingjob(status=RESIZED, annotations={"flotilla.dev/progress": report})
    assert training.job_state(body).resumes_at == 0.0


def test_a_job_never_resized_or_not_placed_trains_now():
    first = {**RESIZED, "reshards": 0}
    assert training.job_state(trainingjob(status=first)).resumes_at == 0.0
    assert training.job_state(trainingjob(status={**RESIZED, "placement": []})).resumes_at == 0.0


def test_a_placed_worker_set_is_unmeasured_until_its_rank_0_reports_a_rate():
    assert training.job_state(trainingjob(status=RESIZED)).rate_unknown
    assert training.job_state(trainingjob(status={**RESIZED, "reshards": 0, "progress": {}})).rate_unknown
    report = json.dumps({"generation": 2, "steps": 420, "stepsPerSecond": 2.5, "time": rfc3339(T0 + 700)})
    assert not training.job_state(trainingjob(status=RESIZED, annotations={"flotilla.dev/progress": report})).rate_unknown
    assert not training.job_state(trainingjob(status={**RESIZED, "placement": []})).rate_unknown
