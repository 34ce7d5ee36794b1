"""Helpers for tests and benchmarks that need real services on this machine."""
