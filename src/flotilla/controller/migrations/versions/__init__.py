"""Revisions, oldest first: 0001 core tables, 0002 idempotency keys and reshard timing."""
