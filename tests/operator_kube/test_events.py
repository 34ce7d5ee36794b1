"""Events: the correlator's decisions (pure), and the recorder's API calls against a fake CoreV1Api (glue)."""

from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from flotilla.operator.events import COMBINED, Bump, Create, Drop, EventCorrelator
from flotilla.operator.recorder import EventRecorder
from flotilla.resources.names import Reason

JOB = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "TrainingJob", "namespace": "ns", "name": "llama", "uid": "u1"}
T0 = 1_800_000_000.0


def test_the_same_event_again_bumps_one_event_to_count_n():
    c = EventCorrelator("flotilla-operator")
    first = c.observe(JOB, "Warning", Reason.WORKER_FAILED, "rank 1 failed", T0)
    assert isinstance(first, Create) and first.body["count"] == 1 and first.body["reason"] == "WorkerFailed"
    later = [c.observe(JOB, "Warning", Reason.WORKER_FAILED, "rank 1 failed", T0 + i) for i in range(1, 5)]
    assert all(isinstance(d, Bump) and d.name == first.name for d in later)
    assert later[-1].patch == {"count": 5, "lastTimestamp": "2027-01-15T08:00:04Z"}


def test_names_are_deterministic_and_differ_by_message_object_and_type():
    a, b = EventCorrelator("flotilla-operator"), EventCorrelator("flotilla-operator")
    one = a.observe(JOB, "Normal", Reason.RESHARDING, "4 -> 8 GPUs", T0)
    assert one.name == b.observe(JOB, "Normal", Reason.RESHARDING, "4 -> 8 GPUs", T0 + 60).name  # after a restart
    assert one.name.startswith("llama.")
    other_message = a.observe(JOB, "Normal", Reason.RESHARDING, "8 -> 4 GPUs", T0)
    other_object = a.observe({**JOB, "uid": "u2"}, "Normal", Reason.RESHARDING, "4 -> 8 GPUs", T0)
    other_type = a.observe(JOB, "Warning", Reason.RESHARDING, "4 -> 8 GPUs", T0)
    assert all(isinstance(d, Create) for d in (other_message, other_object, other_type))
    assert len({one.name, other_message.name, other_object.name, other_type.name}) == 4


def test_past_the_window_a_repeat_is_created_again_under_the_same_name():
    c = EventCorrelator("flotilla-operator", window_s=600)
    first = c.observe(JOB, "Normal", Reason.SCALED, "1:2", T0)
    again = c.observe(JOB, "Normal", Reason.SCALED, "1:2", T0 + 601)
    assert isinstance(again, Create) and again.name == first.name  # the recorder continues the API's count


def test_many_messages_for_one_reason_are_combined_into_one_event():
    c = EventCorrelator("flotilla-operator", max_similar=3)
    made = [c.observe(JOB, "Normal", Reason.CHECKPOINT_WRITTEN, f"step {i}", T0 + i) for i in range(3)]
    assert all(isinstance(d, Create) for d in made)
    combined = c.observe(JOB, "Normal", Reason.CHECKPOINT_WRITTEN, "step 3", T0 + 3)
    assert isinstance(combined, Create) and combined.body["message"] == COMBINED + "step 3"
    more = c.observe(JOB, "Normal", Reason.CHECKPOINT_WRITTEN, "step 4", T0 + 4)
    assert isinstance(more, Bump) and more.name == combined.name
    assert more.patch["count"] == 2 and more.patch["message"] == COMBINED + "step 4"
    assert isinstance(c.observe(JOB, "Normal", Reason.CHECKPOINT_WRITTEN, "step 0", T0 + 5), Bump)  # still its own


def test_spam_filter_bounds_distinct_events_per_object_per_window():
    c = EventCorrelator("flotilla-operator", max_per_object=5, max_similar=100, window_s=600)
    reasons = [Reason.SCALED] * 10
    decisions = [c.observe(JOB, "Normal", r, f"m{i}", T0 + i) for i, r in enumerate(reasons)]
    assert [type(d).__name__ for d in decisions] == ["Create"] * 5 + ["Drop"] * 5
    assert "more than 5 distinct Events for TrainingJob ns/llama" in decisions[-1].why
    assert isinstance(c.observe(JOB, "Normal", Reason.SCALED, "m0", T0 + 20), Bump)  # repeats still count
    assert isinstance(c.observe({**JOB, "uid": "u2", "name": "other"}, "Normal", Reason.SCALED, "m", T0), Create)
    assert isinstance(c.observe(JOB, "Normal", Reason.SCALED, "new", T0 + 700), Create)  # a new window


def test_reasons_come_only_from_names_reason():
    c = EventCorrelator("flotilla-operator")
    with pytest.raises(ValueError, match="names.Reason"):
        c.observe(JOB, "Normal", "SomethingNew", "m", T0)
    with pytest.raises(ValueError, match="type"):
        c.observe(JOB, "Info", Reason.SCALED, "m", T0)


def test_series_memory_is_bounded():
    c = EventCorrelator("flotilla-operator", max_series=3, max_per_object=100, max_similar=100)
    for i in range(10):
        c.observe({**JOB, "uid": f"u{i}", "name": f"j{i}"}, "Normal", Reason.SCALED, "m", T0 + i)
    assert len(c._series) == 3 and len(c._by_object) == 3


class FakeCore:
    """The Event calls of CoreV1Api over a dict of Events (namespace, name) -> body."""

    def __init__(self):
        self.events, self.calls = {}, []

    def create_namespaced_event(self, namespace, body, **kw):
        self.calls.append(("create", body["metadata"]["name"]))
        key = (namespace, body["metadata"]["name"])
        if key in self.events:
            raise ApiException(status=409, reason="AlreadyExists")
        self.events[key] = dict(body)
        return self.events[key]

    def read_namespaced_event(self, name, namespace, **kw):
        self.calls.append(("read", name))
        return SimpleNamespace(count=self.events[(namespace, name)]["count"])

    def patch_namespaced_event(self, name, namespace, patch, **kw):
        self.calls.append(("patch", name))
        if (namespace, name) not in self.events:
            raise ApiException(status=404, reason="NotFound")
        self.events[(namespace, name)].update(patch)
        return self.events[(namespace, name)]


def recorder(core, now):
    return EventRecorder(core, "flotilla-operator", clock=lambda: now[0])


def test_recorder_posts_one_event_with_count_n():
    core, now = FakeCore(), [T0]
    r = recorder(core, now)
    for _ in range(4):
        r.record(JOB, "Warning", Reason.WORKER_FAILED, "rank 1 failed")
        now[0] += 10
    [event] = core.events.values()
    assert event["count"] == 4 and event["firstTimestamp"] == "2027-01-15T08:00:00Z"
    assert event["lastTimestamp"] == "2027-01-15T08:00:30Z" and event["involvedObject"]["uid"] == "u1"
    assert [c[0] for c in core.calls] == ["create", "patch", "patch", "patch"]


def test_a_restarted_recorder_continues_the_count_of_its_earlier_event():
    core, now = FakeCore(), [T0]
    recorder(core, now).record(JOB, "Normal", Reason.RESHARDING, "4 -> 8 GPUs")
    recorder(core, now).record(JOB, "Normal", Reason.RESHARDING, "4 -> 8 GPUs")  # a new process: empty cache
    [event] = core.events.values()
    assert event["count"] == 2 and [c[0] for c in core.calls] == ["create", "create", "read", "patch"]


def test_an_event_gone_from_the_api_server_is_created_again_with_its_count():
    core, now = FakeCore(), [T0]
    r = recorder(core, now)
    r.record(JOB, "Normal", Reason.SCALED, "1:2")
    core.events.clear()  # expired (the API server's event TTL) or deleted
    r.record(JOB, "Normal", Reason.SCALED, "1:2")
    [event] = core.events.values()
    assert event["count"] == 2 and event["message"] == "1:2"


def test_dropped_events_make_no_call_and_are_counted():
    core, now = FakeCore(), [T0]
    r = EventRecorder(core, "flotilla-operator", clock=lambda: now[0],
                      correlator=EventCorrelator("flotilla-operator", max_per_object=2, max_similar=100))
    for i in range(5):
        assert r.record(JOB, "Normal", Reason.SCALED, f"m{i}")
    assert len(core.events) == 2 and r.dropped == 3
