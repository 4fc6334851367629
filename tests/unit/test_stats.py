"""quantload.stats: the one percentile, equal to numpy's bit for bit."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from quantload.stats import finite, percentile


@pytest.mark.parametrize("method", ["linear", "inverted_cdf"])
def test_percentile_equals_numpy_exactly(method: str) -> None:
    rng = random.Random(7)
    for size in (1, 2, 3, 7, 100, 1001):
        values = [rng.lognormvariate(-3, 1) for _ in range(size)]
        for q in (0, 1, 10, 25, 50, 90, 95, 99, 99.9, 100):
            expected = float(np.percentile(np.asarray(values), q, method=method))
            assert percentile(values, q, method) == expected, (size, q)  # type: ignore[arg-type]


def test_percentile_skips_what_is_not_a_finite_number() -> None:
    assert percentile([None, float("nan"), 3.0, True, "x", 1, np.float32(2.0)], 50) == 2.0
    assert percentile([], 50) is None
    assert percentile([None, math.inf], 99) is None
    assert finite([1, 2.5, None, False, np.int64(4)]) == [1.0, 2.5, 4.0]


def test_percentile_outside_0_100_is_an_error() -> None:
    with pytest.raises(ValueError, match="outside 0-100"):
        percentile([1.0], 101)
