"""Migrations and the store against real SQLite and real PostgreSQL."""

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from controller_fixtures import NOW, node, serving, training_job
from flotilla.controller import db
from flotilla.controller.mirror import DecisionRecord, parse_node, parse_serving_deployment, parse_training_job
from flotilla.controller.store import Store
from flotilla.health.samples import Sample


def test_upgrade_from_empty_matches_the_models(db_url):
    engine = db.create_engine(db_url)
    assert db.current_revision(engine) is None
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision() == "0008"
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), db.Base.metadata) == []
    db.upgrade(engine)  # a second start is a no-op
    engine.dispose()


def test_downgrade_and_upgrade_keep_history(db_url, clock):
    engine = db.create_engine(db_url)
    db.upgrade(engine)
    store = Store(engine, clock)
    store.upsert_job(parse_training_job(training_job("j", placement={"a": 4})))
    store.upsert_job(parse_training_job(training_job("j", placement={"a": 8})))
    store.record([DecisionRecord("cordon", "Node", "a", "test")])
    db.downgrade(engine, "0001")
    assert db.current_revision(engine) == "0001"
    assert "idempotency_keys" not in sa.inspect(engine).get_table_names()
    db.upgrade(engine)
    job = store.job("default/j")
    assert job is not None and job[0].placement == {"a": 8} and job[0].resharding_since is None
    kinds = [d.kind for d in store.decisions(limit=10).items]
    assert kinds == ["cordon", "allocation"]
    engine.dispose()


def test_upsert_records_changes_and_reshard_duration(store, clock):
    assert store.upsert_job(parse_training_job(training_job("j", placement={"a": 4}))).decisions == []
    clock.now += 5
    res = store.upsert_job(parse_training_job(training_job("j", placement={"a": 4}, phase="Resharding")))
    assert [d.kind for d in res.decisions] == ["phase"] and res.reshard_seconds is None
    clock.now += 12.5
    res = store.upsert_job(parse_training_job(training_job("j", placement={"a": 4, "b": 4}, reshards=1)))
    assert {d.kind for d in res.decisions} == {"allocation", "reshard", "phase"}
    assert res.reshard_seconds == 12.5
    assert [j.key for j in store.jobs_on_node("b")] == ["default/j"]
    assert len(store.decisions(limit=100, obj="default/j").items) == 4


def test_capacity_domains_and_outlook(store, clock):
    store.upsert_node(parse_node(node("a", 8, labels={"flotilla.dev/rack": "r1"})))
    store.upsert_node(parse_node(node("b", 8, labels={"flotilla.dev/rack": "r1"})))
    store.upsert_node(parse_node(node("c", 4, labels={"flotilla.dev/rack": "r2"}, healthy=False)))
    store.upsert_job(parse_training_job(training_job("ok", placement={"a": 4})))
    store.upsert_job(parse_training_job(training_job("risk", placement={"b": 2}, deadline_met=False)))
    store.upsert_job(parse_training_job(training_job("late", placement={}, deadline=NOW - 1)))
    store.upsert_job(parse_training_job(training_job("free", placement={}, deadline=None)))
    store.upsert_job(parse_training_job(training_job("refused", phase="Rejected", placement={}, deadline=NOW - 1)))
    store.upsert_serving(parse_serving_deployment(serving("s", prefill=1, decode=1)))  # 1*1 + 1*2 GPUs
    assert store.capacity() == {"nodes": 3, "gpus": 20, "schedulableGpus": 16, "trainingGpus": 6,
                                "servingGpus": 3, "freeGpus": 7}
    # A job refused at admission was never promised its deadline: "rejected", not "missed", even once it is past.
    assert store.outlook_counts() == {"on-track": 1, "at-risk": 1, "missed": 1, "rejected": 1, "done": 0,
                                      "no-deadline": 1}
    domains = {d[0]: d[1:] for d in store.domains(limit=10).items}
    assert domains == {"r1": (2, 16, 16, 6), "r2": (1, 4, 0, 0)}
    page1 = store.jobs(limit=2)
    page2 = store.jobs(limit=2, cursor=page1.next_cursor)
    page3 = store.jobs(limit=2, cursor=page2.next_cursor)
    assert [r.name for r, _ in page1.items + page2.items + page3.items] == ["free", "late", "ok", "refused", "risk"]
    assert page3.next_cursor is None


def test_samples_retention_and_latest(store):
    store.add_samples([Sample(NOW - 100, "a", "gpu_util", 90.0, gpu=0), Sample(NOW - 10, "a", "gpu_util", 50.0, gpu=0),
                       Sample(NOW - 10, "a", "gpu_util", 70.0, gpu=1), Sample(NOW - 5, "a", "xid", 79.0)])
    latest = {(s.metric, s.gpu): s.value for s in store.latest_samples("a")}
    assert latest == {("gpu_util", 0): 50.0, ("gpu_util", 1): 70.0, ("xid", None): 79.0}
    assert store.drop_samples_before(NOW - 50) == 1
    assert max(s.ts for s in store.latest_samples("a")) == NOW - 5


def test_plain_postgresql_urls_use_psycopg3():
    for url in ("postgresql://u:p@127.0.0.1/db", "postgres://u:p@127.0.0.1/db"):
        engine = db.create_engine(url)  # no connection is made here
        assert engine.dialect.driver == "psycopg" and engine.url.database == "db"


def test_finished_jobs_hold_no_gpus(store):
    """Both jobs Succeeded with status.placement still set (the operator leaves it): every GPU is free again."""
    for n in ("a", "b", "c"):
        store.upsert_node(parse_node(node(n, 8)))
    store.upsert_job(parse_training_job(training_job("one", placement={"a": 8, "b": 8})))
    store.upsert_job(parse_training_job(training_job("two", placement={"c": 8})))
    assert store.capacity()["trainingGpus"] == 24 and store.capacity()["freeGpus"] == 0
    store.upsert_job(parse_training_job(training_job("one", phase="Succeeded", placement={"a": 8, "b": 8})))
    store.upsert_job(parse_training_job(training_job("two", phase="Failed", placement={"c": 8})))
    assert store.capacity() == {"nodes": 3, "gpus": 24, "schedulableGpus": 24, "trainingGpus": 0,
                                "servingGpus": 0, "freeGpus": 24}
    assert [(r.name, a) for r, a in store.nodes(limit=10).items] == [("a", 0), ("b", 0), ("c", 0)]
    assert store.jobs_on_node("a") == [] and store.job_of_node() == {}
    assert {d[0]: d[4] for d in store.domains(limit=10).items} == {"r1": 0}


def test_upgrading_to_0003_frees_the_gpus_of_jobs_that_finished_before(db_url, clock):
    engine = db.create_engine(db_url)
    db.upgrade(engine, "0002")
    with engine.begin() as conn:  # what a 0002 controller stored for a Succeeded job
        conn.execute(sa.text(
            "INSERT INTO training_jobs (key, namespace, name, phase, priority, best_effort, total_steps, steps, "
            "steps_per_second, min_gpus, max_gpus, gpus, placement, reshards, checkpoint_generation, updated) "
            "VALUES ('default/done', 'default', 'done', 'Succeeded', 0, false, 10, 10, 0, 1, 8, 0, '{}', 0, 0, 0), "
            "('default/live', 'default', 'live', 'Running', 0, false, 10, 1, 0, 1, 8, 4, '{}', 0, 0, 0)"))
        conn.execute(sa.text("INSERT INTO allocations (job, node, gpus) VALUES "
                             "('default/done', 'a', 8), ('default/live', 'b', 4)"))
    db.upgrade(engine)
    assert Store(engine, clock).capacity()["trainingGpus"] == 4
    engine.dispose()


def test_a_new_job_of_an_old_name_is_mirrored_as_a_new_job(store, clock):
    """The old job was deleted and a new one created while the watch was away: the row is the new job's."""
    old = training_job("reuse", phase="Resharding", placement={"a": 8})
    old["metadata"]["uid"] = "uid-old"
    store.upsert_job(parse_training_job(old))
    clock.now += 30
    new = training_job("reuse", phase="Pending", placement={})
    new["metadata"]["uid"] = "uid-new"
    res = store.upsert_job(parse_training_job(new))
    assert res.decisions == [] and res.reshard_seconds is None  # nothing compared with the old job
    row, _ = store.job("default/reuse")
    assert row.uid == "uid-new" and row.resharding_since is None and store.jobs_on_node("a") == []
    # The same job again: changes are recorded as before.
    res = store.upsert_job(parse_training_job(training_job("reuse", phase="Running", placement={"b": 4}) | {
        "metadata": {**new["metadata"]}}))
    assert {d.kind for d in res.decisions} == {"allocation", "phase"}
