"""A rank's pipeline stage from its DeviceMesh or its pipeline's process group, sent with its step times."""

from __future__ import annotations

import json
import multiprocessing
import socket

import pytest

pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

from flotilla.worker.client import JobClient, WorkerIdentity  # noqa: E402
from flotilla.worker.jobfile import FileJobAPI  # noqa: E402
from flotilla.worker.torch import pipeline_role  # noqa: E402

WORLD = 4   # 2 stages x 2 data-parallel replicas


def _rank(rank: int, store: str, out) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
        # the pipelines: one rank per stage, in stage order ([0, 2] and [1, 3]); every rank makes every group
        groups = [dist.new_group([r, r + 2]) for r in (0, 1)]
        out.put((rank, pipeline_role(mesh), pipeline_role(groups[rank % 2])))
        try:
            pipeline_role(mesh, "tp")
        except ValueError as e:
            out.put((rank, "error", str(e)))
    finally:
        dist.destroy_process_group()


def test_each_rank_says_its_stage_from_its_mesh_and_from_its_pipeline_group(tmp_path):
    ctx = multiprocessing.get_context("fork")   # torch is imported already: no re-import per rank
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in range(2 * WORLD)]
    for p in procs:
        p.join(timeout=60)
    roles = {r: (a, b) for r, a, b in got if a != "error"}
    assert roles == {0: ("pp0/2", "pp0/2"), 1: ("pp0/2", "pp0/2"), 2: ("pp1/2", "pp1/2"), 3: ("pp1/2", "pp1/2")}
    errors = [b for _, a, b in got if a == "error"]
    assert len(errors) == WORLD and "no 'tp' dimension" in errors[0] and "'pp', 'dp'" in errors[0]


def test_the_role_travels_with_the_step_times_unless_the_job_declares_one(tmp_path, monkeypatch):
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.bind(("127.0.0.1", 0))
    agent.settimeout(5)
    api = FileJobAPI.create(tmp_path / "job.json", "j", "ns", uid="u1")
    for declared, expected in ((None, "pp1/4"), ("pp3/4", "pp3/4")):
        env = {"FLOTILLA_JOB": "j", "FLOTILLA_NAMESPACE": "ns", "FLOTILLA_AGENT_HOST": "127.0.0.1",
               "FLOTILLA_AGENT_PORT": str(agent.getsockname()[1]), "RANK": "5"}
        if declared:
            env["FLOTILLA_ROLE"] = declared
        for k in ("FLOTILLA_ROLE", "LOCAL_RANK"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        client = JobClient(WorkerIdentity("j", "ns", 5, 8, 0, "u1"), api=api)
        client.report_role("pp1/4")
        assert client.report_step_time(0.5)
        report = json.loads(agent.recv(4096))
        assert (report["rank"], report["role"]) == (5, expected)
    agent.close()
