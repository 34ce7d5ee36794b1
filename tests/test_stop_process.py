import os
import subprocess
import time

from flotilla.testing.services import stop_process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone for our purpose
        return f.read().split(")")[-1].split()[0] != "Z"


def _leader_with_a_child(tmp_path) -> tuple[subprocess.Popen, int]:
    """A shell leading its own process group, and the pid of the background child it started."""
    pids = tmp_path / "pids"
    # sh does not pass SIGTERM on to its background child: a plain stop leaves the child running.
    proc = subprocess.Popen(["sh", "-c", f"sleep 300 & echo $! > {pids}; wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, int(pids.read_text())


def test_stopping_a_group_leader_leaves_none_of_its_children_running(tmp_path):
    proc, child = _leader_with_a_child(tmp_path)
    assert _alive(child)
    stop_process(proc, group=True, timeout=5)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_plain_stop_signals_only_the_child(tmp_path):
    proc, child = _leader_with_a_child(tmp_path)
    try:
        stop_process(proc, timeout=5)
        assert proc.returncode is not None and _alive(child)  # what group=True is for
    finally:
        os.kill(child, 9)
