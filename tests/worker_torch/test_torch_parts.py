"""flotilla.worker.torch's parts that need no process group: the data order, the rendezvous from the pod's
environment, torchrun's arguments; and the job file a worker can run against without Kubernetes."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from flotilla.worker.client import JobClient, WorkerIdentity  # noqa: E402
from flotilla.worker.jobfile import FileJobAPI  # noqa: E402
from flotilla.worker.torch import Rendezvous, SampleOrder, TorchJob, torchrun_args  # noqa: E402

POD = {"FLOTILLA_JOB": "j", "FLOTILLA_NAMESPACE": "ns", "FLOTILLA_RANK": "1", "FLOTILLA_WORLD_SIZE": "3",
       "FLOTILLA_GENERATION": "2", "FLOTILLA_GPUS_PER_WORKER": "8", "FLOTILLA_RENDEZVOUS_ADDR": "j-abcde-g2-w0.rdzv.ns.svc",
       "FLOTILLA_RENDEZVOUS_PORT": "29500"}


def test_the_ranks_shares_make_up_each_global_batch_whatever_the_world_size():
    reference = SampleOrder(50, 12, seed=3)
    batches = [reference.next_batch(0, 1) for _ in range(10)]  # 120 samples: two epochs and a part
    assert sorted(sum(batches[:4], []) + batches[4][:2]) == list(range(50))  # epoch 0, then epoch 1 begins
    for world in (1, 2, 3, 4, 5):
        orders = [SampleOrder(50, 12, seed=3) for _ in range(world)]
        for batch in batches:
            shares = [orders[r].next_batch(r, world) for r in range(world)]
            assert sum(shares, []) == batch
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_the_order_resumes_from_its_state_at_another_world_size():
    first = SampleOrder(50, 12, seed=3)
    for _ in range(7):
        first.next_batch(0, 4)
    ranks = [SampleOrder(50, 12, seed=3) for _ in range(3)]  # the new worker set: 3 ranks, each loads the state
    for order in ranks:
        order.load_state_dict(first.state_dict())
    assert (ranks[0].epoch, ranks[0].position) == (1, 34)
    reference = SampleOrder(50, 12, seed=3)
    expected = [reference.next_batch(0, 1) for _ in range(10)][7:]
    got = [sum((ranks[r].next_batch(r, 3) for r in range(3)), []) for _ in range(3)]
    assert got == expected


def test_a_checkpoint_of_another_data_set_is_refused_naming_both():
    state = SampleOrder(50, 12).state_dict()
    with pytest.raises(ValueError, match="50 samples in batches of 12, this job 60 in 12"):
        SampleOrder(60, 12).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch"):
        SampleOrder(10, 0)


def test_the_rendezvous_comes_from_the_pod_or_from_torchrun():
    r = Rendezvous.from_env(POD)
    assert (r.rank, r.world_size, r.torchrun) == (1, 3, False)
    assert r.init_method() == "tcp://j-abcde-g2-w0.rdzv.ns.svc:29500"
    t = Rendezvous.from_env({**POD, "RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "24", "TORCHELASTIC_RUN_ID": "x",
                             "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    assert (t.rank, t.world_size, t.local_rank, t.init_method()) == (9, 24, 1, "env://")
    with pytest.raises(RuntimeError, match="FLOTILLA_RENDEZVOUS_ADDR not set"):
        Rendezvous.from_env({k: v for k, v in POD.items() if k != "FLOTILLA_RENDEZVOUS_ADDR"})
    assert torchrun_args(POD) == ["--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "8",
                                  "--master-addr", "j-abcde-g2-w0.rdzv.ns.svc", "--master-port", "29500"]


def test_a_job_without_checkpoint_storage_says_which_field_to_set(tmp_path):
    api = FileJobAPI.create(tmp_path / "job.json", "j", "ns")
    with pytest.raises(RuntimeError, match="spec.checkpoint.uri"):
        TorchJob.from_env(api=api, env=POD)
    job = TorchJob.from_env(api=api, env={**POD, "FLOTILLA_CHECKPOINT_DIR": str(tmp_path),
                                          "FLOTILLA_CHECKPOINT_INTERVAL_STEPS": "50"})
    assert (job.rank, job.world_size, job.interval_steps, job.client.identity.generation) == (1, 3, 50, 2)


def test_the_job_file_carries_the_protocol_as_the_api_server_does(tmp_path):
    api = FileJobAPI.create(tmp_path / "job.json", "j", "ns", uid="u1")
    rank0 = JobClient(WorkerIdentity("j", "ns", 0, 2, 0, "u1"), api=api)
    assert rank0.pending_checkpoint(force=True) is None
    api.request_checkpoint(1, "resize")
    request = rank0.pending_checkpoint(force=True)
    assert (request.generation, request.reason) == (1, "resize")
    rank0.acknowledge(request, 40)
    assert api.acknowledged()["step"] == 40 and rank0.pending_checkpoint(force=True) is None
    rank0.report_progress(41, 2.0, 40, force=True, restore_seconds=3.0)
    assert api.progress()["steps"] == 41
    stranger = JobClient(WorkerIdentity("j", "ns", 0, 2, 0, "u0"), api=api)
    with pytest.raises(ValueError, match="uid u0 does not match"):
        stranger.report_progress(1, 1.0, force=True)
