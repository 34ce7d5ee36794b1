"""`flotilla detect` over a JSONL dump: the output contract, and clear errors for bad input."""

import json

from flotilla.agent.simulated import Fault, Fleet
from flotilla.cli import main


def write_dump(path, fleet: Fleet, seconds: int) -> None:
    with open(path, "w") as f:
        for t in range(seconds):
            for s in fleet.samples(float(t)):
                f.write(json.dumps(s.to_dict()) + "\n")


def test_detect_finds_the_injected_faults_and_writes_the_contract_lines(tmp_path):
    members = [(f"n{i}", "team/llm") for i in range(8)]
    faults = [Fault("n3", "fell_off_bus", 10.0, gpu=2), Fault("n6", "pcie_downgrade", 12.0, gpu=5)]
    write_dump(tmp_path / "in.jsonl", Fleet(members, gpus=8, seed=3, faults=faults, jitter=False), 40)
    assert main(["detect", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(d["node"], d["kind"]) for d in lines] == [("n3", "fault"), ("n3", "fault"), ("n6", "fault")]
    # the same second shows both the lost GPU and its XID 79: two kinds of fault, each decided
    assert {d["reason"] for d in lines[:2]} == {"gpu-lost", "xid-79"} and lines[0]["ts"] == 10.0
    assert lines[1]["ts"] <= 13.0
    lines = lines[1:]
    assert lines[1]["reason"] in ("outlier:pcie_link_width", "outlier:pcie_link_gen", "outlier:pcie_tx",
                                  "outlier:pcie_rx")
    assert 12.0 < lines[1]["ts"] <= 20.0
    for d in lines:
        assert set(d) == {"ts", "node", "kind", "reason", "evidence"}
        assert {"metric", "window", "score"} <= d["evidence"].keys()


def test_bad_input_line_is_named(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"ts": 1, "node": "a", "metric": "gpu_util", "value": 1}\n'
                                       '{"ts": 2, "node": "a", "metric": "gpu_util"}\n')
    assert main(["detect", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "input line 2: sample is missing field 'value'" in capsys.readouterr().err
