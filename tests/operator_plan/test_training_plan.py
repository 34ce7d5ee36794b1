"""The operator's pure TrainingJob planning: decisions in, pods and status out."""

import json

import pytest

from flotilla.allocation import JobDecision, Verdict
from flotilla.allocation.fifo import FifoGang
from flotilla.operator import training
from flotilla.operator.actions import CreatePod, DeletePod, PatchAnnotations, PatchStatus, PostEvent
from flotilla.operator.reconcile import reconcile, training_snapshot
from flotilla.reshard import encoding
from tests.operator_plan.builders import T0, node, pod, trainingjob, wname

NOW = T0 + 60


def kinds(actions):
    return [type(a).__name__ for a in actions]


def status_patch(actions) -> dict:
    patches = [a for a in actions if isinstance(a, PatchStatus)]
    assert len(patches) == 1, actions
    return patches[0].status


def test_job_state_reads_spec_status_and_progress_annotation():
    body = trainingjob(status={"phase": "Running", "placement": [{"node": "n0", "gpus": 2}]},
                       annotations={"flotilla.dev/progress": '{"steps": 250, "stepsPerSecond": 1.7}'})
    s = training.job_state(body)
    assert s.key == "ns/job" and s.deadline == T0 + 3600 and s.done_steps == 250 and s.remaining_steps == 750
    assert s.placement == {"n0": 2} and s.verdict is Verdict.ADMITTED
    assert s.curve.rate(2) == 1.0 + 2.0 * (2 - 1) / 3


def test_a_measured_rate_off_the_curve_calibrates_it_and_one_near_it_does_not():
    def state(rate):
        return training.job_state(trainingjob(
            status={"phase": "Running", "placement": [{"node": "n0", "gpus": 4}]},
            annotations={"flotilla.dev/progress": json.dumps({"steps": 10, "stepsPerSecond": rate})}))
    assert state(3.2).curve.rate(4) == 3.0          # within 20 % of the curve's 3.0 steps/s: kept
    slow = state(1.5).curve                           # half as fast as declared: every point halves
    assert slow.rate(4) == 1.5 and slow.rate(1) == 0.5


def test_a_new_placement_is_recorded_before_its_pods_are_created():
    body = trainingjob()
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n1": 1, "n0": 1}, "started")
    actions = training.plan_job(body, [], decision, NOW, "fifo-gang")
    assert kinds(actions)[0] == "PatchStatus"
    st = status_patch(actions)
    assert st["phase"] == "Admitted" and st["gpus"] == 2 and st["workers"] == 2
    assert st["placement"] == [{"node": "n0", "gpus": 1}, {"node": "n1", "gpus": 1}]
    assert st["deadline"] == "2026-01-01T01:00:00Z"
    pods = [a.manifest for a in actions if isinstance(a, CreatePod)]
    assert [p["metadata"]["name"] for p in pods] == [wname("job", 0, 0), wname("job", 0, 1)]
    assert [p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in pods] == ["n0", "n1"]
    env = {e["name"]: e.get("value") for e in pods[1]["spec"]["containers"][0]["env"]}
    assert env["FLOTILLA_RANK"] == "1" and env["FLOTILLA_WORLD_SIZE"] == "2"
    assert pods[0]["metadata"]["labels"]["team"] == "a"
    assert pods[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-job"
    # Admission is routine: a condition says it, no Event.
    assert [(c["type"], c["status"]) for c in st["conditions"]] == [("Admitted", "True")]
    assert not [a for a in actions if isinstance(a, PostEvent)]


def test_gpus_per_worker_makes_one_pod_per_worker():
    body = trainingjob(min_gpus=8, max_gpus=8, per_worker=4)
    pods = training.worker_pods(body, {"n0": 8}, 0)
    assert len(pods) == 2
    assert all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4" for p in pods)


def test_missing_pods_of_the_recorded_placement_are_created_and_existing_ones_kept():
    body = trainingjob(status={"phase": "Admitted", "placement": [{"node": "n0", "gpus": 2}]})
    existing = [pod(wname("job", 0, 0), "job", 0)]
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "running")
    actions = training.plan_job(body, existing, decision, NOW, "fifo-gang")
    assert [a.manifest["metadata"]["name"] for a in actions if isinstance(a, CreatePod)] == (
        [wname("job", 0, 1)])
    assert not [a for a in actions if isinstance(a, DeletePod)]


def test_all_workers_running_makes_the_job_running_once():
    body = trainingjob(status={"phase": "Admitted", "placement": [{"node": "n0", "gpus": 2}]})
    pods = [pod(wname("job", 0, 0), "job", 0), pod(wname("job", 0, 1), "job", 0)]
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "running")
    actions = training.plan_job(body, pods, decision, NOW, "fifo-gang")
    st = status_patch(actions)
    assert st["phase"] == "Running" and st["startedAt"] == training.rfc3339(NOW)
    assert "CreatePod" not in kinds(actions)
    # Once status says Running, the same observation plans no new status or Events.
    body["status"].update(st)
    again = training.plan_job(body, pods, decision, NOW + 1, "fifo-gang")
    assert not [a for a in again if isinstance(a, PostEvent)]


def test_rank0_success_finishes_the_job():
    running = {"phase": "Running", "placement": [{"node": "n0", "gpus": 2}], "startedAt": "2026-01-01T00:00:10Z"}
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "running")
    done = training.plan_job(trainingjob(status=running),
                             [pod(wname("job", 0, 0), "job", 0, "Succeeded"),
                              pod(wname("job", 0, 1), "job", 0, "Succeeded")],
                             decision, NOW, "fifo-gang")
    st = status_patch(done)
    assert st["phase"] == "Succeeded" and st["deadlineMet"] is True and st["gpus"] == 0
    assert training.plan_job(trainingjob(status={**running, "phase": "Succeeded"}), [], decision, NOW, "x") == []


def test_a_failed_worker_restarts_the_set_from_the_last_checkpoint_until_the_limit():
    running = {"phase": "Running", "placement": [{"node": "n0", "gpus": 2}], "startedAt": "2026-01-01T00:00:10Z",
               "checkpoint": {"step": 300, "generation": 0},
               "progress": {"steps": 380, "stepsPerSecond": 1.0, "updatedAt": "2026-01-01T00:00:50Z"}}
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "running")
    pods = [pod(wname("job", 0, 0), "job", 0, "Running"), pod(wname("job", 0, 1), "job", 0, "Failed")]
    actions = training.plan_job(trainingjob(status=running), pods, decision, NOW, "fifo-gang", max_restarts=2)
    st = status_patch(actions)
    # A new worker set, counted as a restart and not as a reshard.
    assert st["phase"] == "Resharding" and st["restarts"] == 1 and st["workerGeneration"] == 1
    assert "reshards" not in st
    assert st["progress"]["steps"] == 300  # back to the last completed checkpoint
    assert sorted(a.name for a in actions if isinstance(a, DeletePod)) == [wname("job", 0, 0), wname("job", 0, 1)]
    # Rank 0 of the old set still holds a GPU of n0 while it terminates: the new set waits for it.
    assert not [a for a in actions if isinstance(a, CreatePod)]
    events = {a.reason: a.message for a in actions if isinstance(a, PostEvent)}
    assert "restart 1 of 2" in events["WorkerFailed"] and "80 steps lost" in events["RestartFromCheckpoint"]
    assert "Resharding" not in events

    exhausted = training.plan_job(trainingjob(status={**running, "restarts": 2}), pods, decision, NOW, "fifo-gang",
                                  max_restarts=2)
    st = status_patch(exhausted)
    assert st["phase"] == "Failed" and "after 2 restarts" in st["message"]
    assert [a.name for a in exhausted if isinstance(a, DeletePod)] == [wname("job", 0, 0)]
    assert not [a for a in exhausted if isinstance(a, CreatePod)]


def _running(**extra):
    status = {"phase": "Running", "placement": [{"node": "n0", "gpus": 2}], "startedAt": "2026-01-01T00:00:10Z",
              "progress": {"steps": 400, "stepsPerSecond": 1.0, "updatedAt": "2026-01-01T00:00:50Z"}}
    status.update(extra)
    return status


MOVE = JobDecision("ns/job", Verdict.ADMITTED, {"n1": 2}, "n0 lost")
OLD_PODS = [pod(wname("job", 0, 0), "job", 0), pod(wname("job", 0, 1), "job", 0)]


def test_a_placement_change_first_asks_rank0_for_a_checkpoint_and_keeps_the_pods():
    actions = training.plan_job(trainingjob(status=_running()), OLD_PODS, MOVE, NOW, "p")
    st = status_patch(actions)
    assert st["phase"] == "Resharding" and st["checkpoint"]["requestedGeneration"] == 1
    req = next(a for a in actions if isinstance(a, PatchAnnotations)).annotations
    assert json.loads(req["flotilla.dev/checkpoint-request"])["generation"] == 1
    assert not [a for a in actions if isinstance(a, (CreatePod, DeletePod))]


def test_after_the_acknowledgement_the_worker_set_is_replaced_and_progress_kept():
    ack = json.dumps({"generation": 1, "step": 420, "time": "2026-01-01T00:00:59Z"})
    body = trainingjob(status=_running(phase="Resharding", checkpoint={"requestedGeneration": 1,
                                                                       "requestedAt": training.rfc3339(NOW - 5)}),
                       annotations={"flotilla.dev/checkpoint-ack": ack})
    actions = training.plan_job(body, OLD_PODS, MOVE, NOW, "p")
    st = status_patch(actions)
    assert st["reshards"] == 1 and st["placement"] == [{"node": "n1", "gpus": 2}]
    assert st["checkpoint"]["generation"] == 1 and st["checkpoint"]["step"] == 420
    assert st["progress"]["steps"] == 420
    assert sorted(a.name for a in actions if isinstance(a, DeletePod)) == [wname("job", 0, 0), wname("job", 0, 1)]
    assert [a.manifest["metadata"]["name"] for a in actions if isinstance(a, CreatePod)] == (
        [wname("job", 1, 0), wname("job", 1, 1)])
    reasons = [a.reason for a in actions if isinstance(a, PostEvent)]
    assert reasons == ["CheckpointWritten", "Resharding"]


def test_an_acknowledged_checkpoint_replaces_the_worker_set_even_when_the_move_was_called_off():
    # The decision asked for a move, then changed back before rank 0's acknowledgement was read (a job grown into
    # GPUs that were taken again). The workers stopped at the checkpoint to be replaced: they are, in place.
    ack = json.dumps({"generation": 1, "step": 420, "time": "2026-01-01T00:00:59Z"})
    body = trainingjob(status=_running(phase="Resharding", checkpoint={"requestedGeneration": 1,
                                                                       "requestedAt": training.rfc3339(NOW - 5)}),
                       annotations={"flotilla.dev/checkpoint-ack": ack})
    stay = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "admitted")
    actions = training.plan_job(body, OLD_PODS, stay, NOW, "p")
    st = status_patch(actions)
    assert st["reshards"] == 1 and st["placement"] == [{"node": "n0", "gpus": 2}]
    assert st["checkpoint"]["generation"] == 1 and st["progress"]["steps"] == 420
    assert sorted(a.name for a in actions if isinstance(a, DeletePod)) == [wname("job", 0, 0), wname("job", 0, 1)]
    assert not [a for a in actions if isinstance(a, CreatePod)]  # the old containers still hold n0's GPUs
    # Once that is recorded and the old pods are gone, the new set is created where the old one ran, and no
    # checkpoint is asked for again.
    after = trainingjob(status={**_running(), **{k: v for k, v in st.items() if k != "phase"}},
                        annotations={"flotilla.dev/checkpoint-ack": ack})
    actions = training.plan_job(after, [], stay, NOW + 1, "p")
    assert [a.manifest["metadata"]["name"] for a in actions if isinstance(a, CreatePod)] == (
        [wname("job", 1, 0), wname("job", 1, 1)])
    assert not [a for a in actions if isinstance(a, (DeletePod, PatchAnnotations))]


def test_without_an_acknowledgement_the_job_waits_then_restarts_from_the_last_checkpoint():
    body = trainingjob(status=_running(phase="Resharding",
                                       checkpoint={"requestedGeneration": 1, "step": 300,
                                                   "requestedAt": training.rfc3339(NOW - 10)}),
                       annotations=encoding.request_annotation(1, "n0 lost", NOW - 10))
    waiting = training.plan_job(body, OLD_PODS, MOVE, NOW, "p", ack_timeout=60)
    assert not [a for a in waiting if isinstance(a, (CreatePod, DeletePod, PatchAnnotations))]
    late = training.plan_job(body, OLD_PODS, MOVE, NOW + 100, "p", ack_timeout=60)
    st = status_patch(late)
    assert st["reshards"] == 1 and st["progress"]["steps"] == 300 and st["checkpoint"]["generation"] == 1
    events = {a.reason: a.message for a in late if isinstance(a, PostEvent)}
    assert "RestartFromCheckpoint" in events and "100 steps lost" in events["Resharding"]


def test_a_request_in_status_without_its_annotation_gets_it_written_again():
    """The operator stopped between the status patch and the annotation: rank 0 would never see the request."""
    body = trainingjob(status=_running(phase="Resharding",
                                       checkpoint={"requestedGeneration": 1, "step": 300, "reason": "n0 lost",
                                                   "requestedAt": training.rfc3339(NOW - 10)}))
    waiting = training.plan_job(body, OLD_PODS, MOVE, NOW, "p", ack_timeout=60)
    [notes] = [a.annotations for a in waiting if isinstance(a, PatchAnnotations)]
    assert encoding.parse_request(notes) == {"generation": 1, "reason": "n0 lost", "requestedBy": "operator",
                                             "restart": False, "time": training.rfc3339(NOW - 10)}
    assert not [a for a in waiting if isinstance(a, (CreatePod, DeletePod))]


def test_a_restart_request_from_the_controller_does_not_wait():
    req = json.dumps({"generation": 3, "reason": "XID 79 on n0", "requestedBy": "controller", "restart": True})
    body = trainingjob(status=_running(), annotations={"flotilla.dev/checkpoint-request": req})
    actions = training.plan_job(body, OLD_PODS, MOVE, NOW, "p")
    st = status_patch(actions)
    assert st["reshards"] == 1 and st["checkpoint"]["generation"] == 3


def test_a_job_that_never_ran_moves_without_a_checkpoint():
    body = trainingjob(status={"phase": "Admitted", "placement": [{"node": "n0", "gpus": 2}]})
    actions = training.plan_job(body, [pod(wname("job", 0, 0), "job", 0, "Pending")], MOVE, NOW, "p")
    assert status_patch(actions)["reshards"] == 1
    assert not [a for a in actions if isinstance(a, PatchAnnotations)]


RUNNING = {"phase": "Running", "placement": [{"node": "n0", "gpus": 2}], "startedAt": "2026-01-01T00:00:10Z",
           "progress": {"steps": 100, "stepsPerSecond": 1.0, "updatedAt": "2026-01-01T00:00:50Z"},
           "checkpoint": {"step": 100}, "observedGeneration": 1, "deadline": "2026-01-01T01:00:00Z",
           "policy": "fifo-gang", "deadlineMet": True}


FIRST = {k: v for k, v in RUNNING.items() if k != "progress"}  # started at 00:00:10, no progress in status yet


@pytest.mark.parametrize("status, report, mirrored", [
    (RUNNING, {"steps": 140, "stepsPerSecond": 1.0, "time": "2026-01-01T00:01:30Z"}, False),  # 40 s newer: can wait
    (RUNNING, {"steps": 160, "stepsPerSecond": 1.0, "time": "2026-01-01T00:01:50Z"}, True),   # 60 s newer
    (RUNNING, {"steps": 104, "stepsPerSecond": 1.0, "time": "2026-01-01T00:00:54Z", "checkpointStep": 104}, True),
    (FIRST, {"steps": 5, "stepsPerSecond": 1.0, "time": "2026-01-01T00:00:15Z"}, False),  # 5 s after the start
    (FIRST, {"steps": 60, "stepsPerSecond": 1.0, "time": "2026-01-01T00:01:10Z"}, True),
])
def test_progress_reaches_status_every_minute_or_with_a_new_checkpoint(status, report, mirrored):
    body = trainingjob(status=status, annotations={"flotilla.dev/progress": json.dumps(report)})
    pods = [pod(wname("job", 0, 0), "job", 0), pod(wname("job", 0, 1), "job", 0)]
    actions = training.plan_job(body, pods, JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "running"),
                                NOW, "fifo-gang")
    patches = [a.status for a in actions if isinstance(a, PatchStatus)]
    assert bool(patches) == mirrored
    if mirrored:
        assert patches[0]["progress"]["steps"] == report["steps"] and "estimatedCompletion" in patches[0]
        assert patches[0].get("checkpoint", {}).get("step") == report.get("checkpointStep")


def test_progress_from_an_older_worker_set_is_ignored():
    stale = json.dumps({"steps": 900, "generation": 0})
    body = trainingjob(status={"reshards": 1, "progress": {"steps": 420}},
                       annotations={"flotilla.dev/progress": stale})
    assert training.progress_of(body)["steps"] == 420


def test_pending_and_rejected_jobs_say_why():
    pending = training.plan_job(trainingjob(), [], JobDecision("ns/job", Verdict.PENDING, {}, "waiting for 2 GPUs"),
                                NOW, "fifo-gang")
    assert status_patch(pending)["phase"] == "Pending" and status_patch(pending)["message"] == "waiting for 2 GPUs"
    rejected = training.plan_job(trainingjob(), [], JobDecision("ns/job", Verdict.REJECTED, {}, "needs 16 GPUs"),
                                 NOW, "x")
    st = status_patch(rejected)
    assert st["phase"] == "Rejected" and st["conditions"][0]["reason"] == "Rejected"
    assert [(a.type, a.reason) for a in rejected if isinstance(a, PostEvent)] == [("Warning", "Rejected")]


def test_unschedulable_nodes_and_serving_pods_are_taken_out_of_the_snapshot():
    nodes = {"n0": node("n0"), "n1": node("n1", unschedulable=True),
             "n2": node("n2", taints=[{"key": "flotilla.dev/unhealthy", "effect": "NoSchedule"}]),
             "n3": node("n3", ready=False)}
    pods = {"ns/sd-decode-x": pod("sd-decode-x", "sd", 0, node_name="n0", gpus=2, role="decode"),
            "ns/done": pod("done", "sd", 0, phase="Succeeded", node_name="n0", gpus=4, role="decode")}
    snap = training_snapshot(NOW, {}, nodes, pods)
    usable = {n.name: n.usable_gpus for n in snap.nodes}
    assert usable == {"n0": 6, "n1": 0, "n2": 0, "n3": 0}


def test_reconcile_places_jobs_in_fifo_order_until_the_cluster_is_full():
    jobs = {f"ns/j{i}": trainingjob(f"j{i}", min_gpus=4, max_gpus=8) for i in range(3)}
    jobs["ns/j1"]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"
    jobs["ns/j2"]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:02Z"
    actions = reconcile(NOW, FifoGang(), jobs, {"n0": node("n0")}, {}, {}, {})
    phases = {a.name: a.status["phase"] for a in actions if isinstance(a, PatchStatus)}
    assert phases == {"j0": "Admitted", "j1": "Admitted", "j2": "Pending"}


def _env(pod):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_every_worker_gets_its_nodes_agent_address_and_a_rank_label():
    pods = training.worker_pods(trainingjob(), {"n0": 1, "n1": 1}, 0, agent_port=19477)
    for rank, p in enumerate(pods):
        env = _env(p)
        assert env["FLOTILLA_AGENT_HOST"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
        assert env["FLOTILLA_AGENT_PORT"] == "19477"
        assert "FLOTILLA_ROLE" not in env and "flotilla.dev/stage" not in p["metadata"]["labels"]
        assert p["metadata"]["labels"]["flotilla.dev/rank"] == str(rank)
    assert _env(training.worker_pods(trainingjob(), {"n0": 1}, 0)[0])["FLOTILLA_AGENT_PORT"] == "9477"


def test_pipeline_stages_give_contiguous_rank_blocks_a_stage_label_and_a_role():
    body = trainingjob(min_gpus=8, max_gpus=8)
    body["spec"]["parallelism"] = {"pipelineStages": 4}
    pods = training.worker_pods(body, {"n0": 4, "n1": 4}, 0)
    assert [p["metadata"]["labels"]["flotilla.dev/stage"] for p in pods] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert [_env(p)["FLOTILLA_ROLE"] for p in pods][::2] == ["pp0/4", "pp1/4", "pp2/4", "pp3/4"]
    assert [p["metadata"]["labels"]["flotilla.dev/rank"] for p in pods] == [str(r) for r in range(8)]


def test_stages_of_a_world_that_is_not_a_multiple_differ_by_one_rank():
    assert [training.stage_of(r, 6, 4) for r in range(6)] == [0, 0, 1, 2, 2, 3]
    assert [training.stage_of(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]


def test_the_agent_port_reaches_the_pods_the_reconciler_creates():
    body = trainingjob()
    actions = reconcile(NOW, FifoGang(), {"ns/job": body}, {"n0": node("n0")}, {}, {}, {}, agent_port=20000)
    pods = [a.manifest for a in actions if isinstance(a, CreatePod)]
    assert pods and all(_env(p)["FLOTILLA_AGENT_PORT"] == "20000" for p in pods)


def _started(p, at):
    p["status"]["startTime"] = at
    return p


def test_workers_that_just_started_are_recorded_running_once_the_quiet_time_passed_with_their_start_time():
    admitted = {k: v for k, v in RUNNING.items() if k not in ("progress", "startedAt")}
    body = trainingjob(status={**admitted, "phase": "Admitted", "reshards": 0})  # as the admission wrote it
    started = training.rfc3339(NOW - 4)
    pods = [_started(pod(wname("job", 0, r), "job", 0), started) for r in range(2)]
    decision = JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "running")
    assert not [a for a in training.plan_job(body, pods, decision, NOW, "fifo-gang") if isinstance(a, PatchStatus)]
    later = status_patch(training.plan_job(body, pods, decision, NOW + training.QUIET_SECONDS, "fifo-gang"))
    assert later["phase"] == "Running" and later["startedAt"] == started


def test_a_job_that_ends_within_the_quiet_time_goes_from_admitted_to_succeeded_in_one_write():
    body = trainingjob(status={"phase": "Admitted", "placement": [{"node": "n0", "gpus": 1}], "reshards": 0})
    started = training.rfc3339(NOW - 3)
    pods = [_started(pod(wname("job", 0, 0), "job", 0, phase="Succeeded"), started)]
    actions = training.plan_job(body, pods, JobDecision("ns/job", Verdict.ADMITTED, {"n0": 1}, "x"), NOW, "fifo-gang")
    [patch] = [a.status for a in actions if isinstance(a, PatchStatus)]
    assert patch["phase"] == "Succeeded" and patch["startedAt"] == started


def test_a_new_job_waiting_for_gpus_is_written_pending_only_after_the_quiet_time():
    from flotilla.operator.timeutil import to_unix

    created = to_unix(trainingjob()["metadata"]["creationTimestamp"])
    waiting = JobDecision("ns/job", Verdict.PENDING, {}, "waiting for 2 GPUs")
    assert training.plan_job(trainingjob(), [], waiting, created + 1, "fifo-gang") == []
    later = status_patch(training.plan_job(trainingjob(), [], waiting, created + training.QUIET_SECONDS, "fifo-gang"))
    assert later["phase"] == "Pending" and later["message"] == "waiting for 2 GPUs"
    placed = training.plan_job(trainingjob(), [], JobDecision("ns/job", Verdict.ADMITTED, {"n0": 2}, "placed"),
                               created + 1, "fifo-gang")
    first = status_patch(placed)
    assert first["phase"] == "Admitted" and first["placement"] == [{"node": "n0", "gpus": 2}]


def test_the_promised_share_is_written_and_read_back_and_keeps_a_waiting_job_admitted():
    waiting = JobDecision("ns/job", Verdict.ADMITTED, {}, "admitted; no GPUs now", share=3)
    patch = status_patch(training.plan_job(trainingjob(status={"phase": "Pending"}), [], waiting, NOW + 60,
                                           "elastic-deadline"))
    assert patch["guaranteedShare"] == 3 and patch["phase"] == "Pending"
    state = training.job_state(trainingjob(status={"phase": "Pending", "guaranteedShare": 3}))
    assert state.share == 3 and state.verdict is Verdict.ADMITTED  # not a newcomer again next pass
    assert training.job_state(trainingjob(status={"phase": "Pending"})).verdict is None
    # An unchanged share is not written again.
    written = {**patch, "guaranteedShare": 3}
    same = training.plan_job(trainingjob(status=written), [], waiting, NOW + 60, "elastic-deadline")
    assert not [a for a in same if isinstance(a, PatchStatus)]
    # A smaller share (the job is ahead of its plan) costs no write of its own: it goes with the next one.
    smaller = JobDecision("ns/job", Verdict.ADMITTED, {}, "admitted; no GPUs now", share=2)
    assert not [a for a in training.plan_job(trainingjob(status=written), [], smaller, NOW + 60, "elastic-deadline")
                if isinstance(a, PatchStatus)]
    moved = JobDecision("ns/job", Verdict.ADMITTED, {}, "admitted; still no GPUs now", share=2)
    assert status_patch(training.plan_job(trainingjob(status=written), [], moved, NOW + 60,
                                          "elastic-deadline"))["guaranteedShare"] == 2


@pytest.mark.parametrize("per_worker, placement", [(1, {"n0": 3}), (2, {"n1": 4, "n0": 2}), (8, {"n2": 8, "n0": 16}),
                                                   (4, {"n0": 4, "n1": 4, "n10": 8})])
def test_worker_names_are_the_worker_pods_names(per_worker, placement):
    body = trainingjob(min_gpus=1, max_gpus=32, per_worker=per_worker)
    for generation in (0, 3):
        assert training.worker_names(body, placement, generation) == [
            p["metadata"]["name"] for p in training.worker_pods(body, placement, generation)]


def test_a_shrink_after_the_user_lowers_max_gpus_names_that_cause():
    """Not "to make room for guaranteed shares": the user's own change of spec.elasticity.maxGPUs."""
    from flotilla.allocation import policies

    body = trainingjob(max_gpus=2, status=_running(placement=[{"node": "n0", "gpus": 4}], gpus=4,
                                                    startedAt="2026-01-01T00:00:10Z"))
    pods = {f"ns/{wname('job', 0, r)}": pod(wname("job", 0, r), "job", 0) for r in range(4)}
    actions = reconcile(NOW, policies.get("elastic-deadline"), {"ns/job": body}, {"n0": node("n0")}, pods, {}, {})
    [asked] = [a.message for a in actions if isinstance(a, PostEvent) and a.reason == "CheckpointRequested"]
    assert "shrinks 4->2 GPUs: spec.elasticity.maxGPUs is now 2" in asked and "guaranteed shares" not in asked
