"""The resharding protocol, pure: its annotations (`encoding`), the typed view it reads (`view`) and the
transition it decides (`protocol`). No Kubernetes, HTTP or database imports (tests/test_import_contracts.py)."""
