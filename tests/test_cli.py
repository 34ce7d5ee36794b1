import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _operator_args(*argv: str):
    import argparse

    from flotilla.commands import operator

    parser = argparse.ArgumentParser()
    operator.add_arguments(parser)
    return operator, parser.parse_args(list(argv))


def test_the_operator_reads_the_pool_policy_file_and_names_what_is_wrong(tmp_path):
    from flotilla.pool import PoolPolicy

    operator, args = _operator_args()
    assert operator.pool_policy(args) == PoolPolicy()
    good = tmp_path / "pool.yaml"
    good.write_text("holdDownSeconds: 30\nborrowGuaranteed: true\n")
    assert operator.pool_policy(_operator_args("--pool-policy", str(good))[1]) == PoolPolicy(
        hold_down_seconds=30, borrow_guaranteed=True)
    assert operator.pool_policy(_operator_args("--no-pool")[1]) is None
    assert operator.pool_policy(_operator_args("--policy", "fifo-gang")[1]) is None
    bad = tmp_path / "bad.yaml"
    for text, message in [("holdDown: 30\n", r"unknown key\(s\) holdDown"),
                          ("holdDownSeconds: soon\n", "holdDownSeconds must be a number"),
                          ("- 1\n", "expected a mapping")]:
        bad.write_text(text)
        with pytest.raises(SystemExit, match=message):
            operator.pool_policy(_operator_args("--pool-policy", str(bad))[1])
    with pytest.raises(SystemExit, match="needs --policy elastic-deadline"):
        operator.pool_policy(_operator_args("--policy", "fifo-gang", "--pool-policy", str(good))[1])
    with pytest.raises(SystemExit, match="No such file"):
        operator.pool_policy(_operator_args("--pool-policy", str(tmp_path / "missing.yaml"))[1])


def test_demo_console_tokens_are_made_once_owner_only_and_accepted_by_the_controller(tmp_path):
    from flotilla.commands.demo import console_tokens
    from flotilla.controller.auth import TokenAuthenticator

    path = tmp_path / "console-tokens"
    read, admin = console_tokens(path)
    assert console_tokens(path) == (read, admin)  # the same tokens on the next run
    assert path.stat().st_mode & 0o777 == 0o600
    auth = TokenAuthenticator(path)
    assert (auth.identify(read).role, auth.identify(admin).role) == ("read", "admin")
    path.write_text(f"{read},read,viewer\n")
    with pytest.raises(SystemExit, match="needs a read and an admin token"):
        console_tokens(path)


@pytest.mark.parametrize("argv, message", [
    (["controller", "--no-kubernetes", "--tokens-file", "{tokens}", "--db-url", "sqlite:///{db}"],
     "{tokens} line 1: token must be at least 16 characters"),
    (["operator", "--pool-policy", "{missing}"], "--pool-policy {missing}: [Errno 2] No such file or directory"),
    (["operator", "--metrics-port", "70000"], "--metrics-port must be at most 65535, got 70000"),
])
def test_a_configuration_error_at_start_up_is_one_line_and_exit_2(tmp_path, argv, message):
    paths = {"tokens": tmp_path / "tokens", "db": tmp_path / "c.db", "missing": tmp_path / "none.yaml"}
    paths["tokens"].write_text("short,read,alice\n")
    argv = [a.format(**paths) for a in argv]
    out = subprocess.run([sys.executable, "-m", "flotilla.cli", *argv], capture_output=True, text=True, env=ENV,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flotilla {argv[0]}: error: {message.format(**paths)}"), lines
    assert not paths["db"].exists()  # refused before the database was touched
