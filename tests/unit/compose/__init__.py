"""Helpers for tests/unit/test_compose.py, and through pyproject's pythonpath for
tests/integration/test_compose_processes.py, test_kubernetes.py and test_packaging.py: reading the
compose files as compose would, the pinned llama.cpp argument table, the quantload CLI, the
Dockerfile, and the optional validators (tools.py: the ones only the integration tests run)."""
