"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

import pytest

from flotilla.testing.services import redis_server


@pytest.fixture(scope="session")
def redis_url():
    """URL of a real redis-server started for this test session."""
    with redis_server() as url:
        yield url
