"""Fixtures of the observe tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fake_grafana import FakeGrafana


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    """A fake Grafana that takes any credentials; closed after the test."""
    fake = FakeGrafana()
    yield fake
    fake.close()
