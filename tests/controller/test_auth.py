"""Tokens file parsing, roles, reload on change, TokenReview fallback."""

import logging
import os

import pytest

from controller_fixtures import ADMIN, READER
from flotilla.controller.auth import Identity, TokenAuthenticator, create_tokens_file, parse_tokens


def test_parse_and_identify(tokens_file):
    a = TokenAuthenticator(tokens_file)
    assert a.identify(ADMIN) == Identity("alice", "admin")
    assert a.identify(READER) == Identity("bob", "read")
    assert a.identify(ADMIN[:-1]) is None and a.identify("") is None


@pytest.mark.parametrize("who, needed, allowed", [
    ("admin", "read", True), ("admin", "ingest", True), ("admin", "admin", True),
    ("read", "read", True), ("read", "admin", False), ("read", "ingest", False),
    ("ingest", "ingest", True), ("ingest", "read", False), ("ingest", "admin", False),
])
def test_roles(who, needed, allowed):
    assert Identity("x", who).may(needed) is allowed


@pytest.mark.parametrize("line, message", [
    ("tok-0123456789abcdef,root,x", "line 1: role must be one of read, ingest, admin"),
    ("tok-0123456789abcdef,admin", "line 1: expected"),
    ("short,admin,x", "line 1: token must be at least 16 characters"),
])
def test_bad_lines_name_the_line_not_the_token(line, message):
    with pytest.raises(ValueError) as e:
        parse_tokens(line)
    assert message in str(e.value) and line.split(",")[0] not in str(e.value)


def test_reload_on_change_keeps_last_good(tokens_file):
    a = TokenAuthenticator(tokens_file)
    tokens_file.write_text("new-token-0123456789,read,carol\n")
    os.utime(tokens_file, (1, 1))
    assert a.identify("new-token-0123456789") == Identity("carol", "read")
    assert a.identify(ADMIN) is None
    tokens_file.write_text("garbage\n")
    os.utime(tokens_file, (2, 2))
    assert a.identify("new-token-0123456789") == Identity("carol", "read")


def test_token_review_fallback(tokens_file):
    seen = []

    def review(token):
        seen.append(token)
        return Identity("system:serviceaccount:ops:bot", "read") if token == "sa-token" else None

    a = TokenAuthenticator(tokens_file, review)
    assert a.identify(ADMIN).role == "admin" and seen == []
    assert a.identify("sa-token") == Identity("system:serviceaccount:ops:bot", "read")


def test_created_file_has_an_admin_token_and_is_private(tmp_path, caplog):
    path = tmp_path / "sub" / "tokens"
    with caplog.at_level(logging.DEBUG):
        create_tokens_file(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    [(digest, who)] = parse_tokens(path.read_text())
    assert who == Identity("admin", "admin")
    token = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")][0].split(",")[0]
    assert token not in caplog.text
