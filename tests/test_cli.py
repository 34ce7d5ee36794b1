import os
import subprocess
import sys
from pathlib import Path

from flotilla import cli

ENV = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).resolve().parents[1])}


def test_every_registered_command_has_its_module_and_help():
    for name, (module, help_) in cli.COMMANDS.items():
        mod = __import__(module, fromlist=["run"])
        assert callable(mod.add_arguments) and callable(mod.run) and help_


def test_help_lists_the_commands_and_no_command_exits_2():
    out = subprocess.run([sys.executable, "-m", "flotilla.cli", "--help"], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0 and "operator" in out.stdout
    assert subprocess.run([sys.executable, "-m", "flotilla.cli"], capture_output=True, env=ENV).returncode == 2
