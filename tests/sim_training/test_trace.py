"""The trace generator and the CSV format."""

import pytest

from flotilla.sim.training_trace import MODEL_FAMILIES, generate, read_csv, write_csv


def test_generator_is_seeded_and_reproducible():
    assert generate(50, 64, seed=3) == generate(50, 64, seed=3)
    assert generate(50, 64, seed=3) != generate(50, 64, seed=4)


@pytest.mark.parametrize("arrivals", ["poisson", "bursty"])
def test_generated_jobs_respect_their_shape(arrivals):
    jobs = generate(300, 64, seed=1, arrivals=arrivals, deadline_factor=(1.2, 3.0))
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)
    for j in jobs:
        duration = j.total_steps / j.curve.rate(j.requested_gpus)
        assert 1.2 * duration - 1 <= j.deadline - j.submit <= 3.0 * duration + 1
        assert j.min_gpus <= j.requested_gpus <= j.max_gpus <= 64
        assert j.model in MODEL_FAMILIES
    sizes = [j.requested_gpus for j in jobs]
    assert sizes.count(1) > sizes.count(16) > 0  # heavy-tailed: most jobs small


def test_model_families_are_sublinear():
    for curve in MODEL_FAMILIES.values():
        assert curve.rate(8) < 8 * curve.rate(1)


def test_csv_round_trip(tmp_path):
    jobs = generate(40, 32, seed=2)
    write_csv(jobs, tmp_path / "t.csv")
    assert read_csv(tmp_path / "t.csv") == jobs


def test_csv_with_duration_relative_deadline_and_explicit_curve(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_s,requested_gpus,duration_s,deadline_s,curve,max_gpus\n"
                    "x,10,2,100,250,1:1.0;2:1.5;4:2.0,4\n")
    (job,) = read_csv(path)
    assert job.total_steps == 150  # 100 s at 1.5 steps/s
    assert job.deadline == 260
    assert (job.min_gpus, job.max_gpus, job.gpus_per_worker, job.restore_seconds) == (1, 4, 1, 30.0)
    assert job.curve.rate(4) == 2.0


@pytest.mark.parametrize("header, row, message", [
    ("job_id,submit_s", "a,0", "missing column(s) requested_gpus"),
    ("job_id,submit_s,requested_gpus,total_steps,deadline_s", "a,0,1,10,5", "give column 'model' or 'curve'"),
    ("job_id,submit_s,requested_gpus,total_steps,deadline_s,model", "a,0,1,10,5,alexnet", "unknown family 'alexnet'"),
    ("job_id,submit_s,requested_gpus,total_steps,deadline_s,model", "a,soon,1,10,5,bert",
     "column 'submit_s' must be a number"),
    ("job_id,submit_s,requested_gpus,total_steps,model", "a,0,1,10,bert", "give column 'deadline_s' or"),
    ("job_id,submit_s,requested_gpus,total_steps,deadline_s,curve", "a,0,1,10,5,1-2", "column 'curve' must be"),
    ("job_id,submit_s,requested_gpus,total_steps,deadline_s,model,min_gpus", "a,0,4,10,5,bert,8",
     "'min_gpus' <= 'max_gpus'"),
])
def test_csv_errors_name_the_line_and_column(tmp_path, header, row, message):
    path = tmp_path / "t.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_csv(path)
