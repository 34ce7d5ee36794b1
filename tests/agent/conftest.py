import sys
from pathlib import Path

# the fake pynvml module lives beside the tests
sys.path.insert(0, str(Path(__file__).parent))

import shutil
import subprocess

import pytest

from flotilla.testing.services import free_port, wait_for_port


class RestartableRedis:
    """A redis-server on a fixed loopback port that a test can stop and start again."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.tmp, self.proc = free_port(), tmp, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.tmp)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, proc=self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def restartable_redis(tmp_path):
    server = RestartableRedis(tmp_path)
    yield server
    server.stop()
