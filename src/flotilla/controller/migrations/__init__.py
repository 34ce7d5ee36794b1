"""Alembic migrations for the controller database (run at start-up by flotilla.controller.db.upgrade)."""
