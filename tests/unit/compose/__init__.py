"""Helpers for tests/unit/test_compose.py: reading the compose files as compose would, the pinned
llama.cpp argument table, the quantload CLI, the Dockerfile, and the optional validators."""
