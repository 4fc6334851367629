"""Request length distributions: how many prompt and output tokens each request asks for.

A distribution is written as one short text, the same in quantload.toml, the environment and
on the command line:

  fixed:128                         every request 128 tokens
  uniform:100-400                   uniform between 100 and 400 (inclusive)
  normal:mean=500,sd=120            normal, rounded, clipped to the bounds
  lognormal:mean=500,spread=0.8     lognormal whose own mean is 500 tokens; `spread` is the
                                    standard deviation of the log (0.8 = a long right tail)
  buckets:128x0.5,512x0.3,2048x0.2  weighted values (value x weight; weights are normalized)

Samples are reproducible from a seed and always within [minimum, maximum] tokens. A parameter
that is not a finite number, a length above `MAX_LENGTH_TOKENS` (which a sample could never reach)
or a spread too wide to draw from is refused when the text is read, never clipped in silence.
"""

from __future__ import annotations

__all__ = ["LengthDistribution", "parse_length_distribution"]

import math
import random
from dataclasses import dataclass
from typing import Literal

from quantload.errors import ConfigError

Kind = Literal["fixed", "uniform", "normal", "lognormal", "buckets"]
MAX_LENGTH_TOKENS = 1_000_000  # the most tokens a drawn length may be (prompt or output)
MAX_LOG_SPREAD = 5.0  # a lognormal spread beyond this draws lengths over 10**6 times the mean
MAX_WEIGHT = 1e9
EXAMPLES = (
    "fixed:128, uniform:100-400, normal:mean=500,sd=120, lognormal:mean=500,spread=0.8,"
    " buckets:128x0.5,2048x0.5"
)


@dataclass(frozen=True)
class LengthDistribution:
    """One named distribution of token counts (see the module docstring for the text form)."""

    kind: Kind
    low: float = 0.0  # fixed: the value; uniform: the lower end
    high: float = 0.0  # uniform: the upper end
    mean: float = 0.0  # normal, lognormal
    spread: float = 0.0  # normal: sd; lognormal: sd of the log
    buckets: tuple[tuple[int, float], ...] = ()  # (tokens, weight)

    @property
    def expected_tokens(self) -> float:
        """The distribution's mean before clipping, for sizing a stage."""
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        if self.kind in ("normal", "lognormal"):
            return self.mean
        total = sum(weight for _, weight in self.buckets)
        return sum(tokens * weight for tokens, weight in self.buckets) / total

    def sample(self, count: int, seed: int, minimum: int = 1, maximum: int = MAX_LENGTH_TOKENS) -> list[int]:
        """`count` token counts, the same for the same seed, each within [minimum, maximum]."""
        rng = random.Random(seed)
        return [min(max(round(self._draw(rng)), minimum), maximum) for _ in range(count)]

    def _draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "normal":
            return rng.gauss(self.mean, self.spread)
        if self.kind == "lognormal":
            # a lognormal's mean is exp(mu + sigma^2 / 2): choose mu so the mean is `mean`
            mu = math.log(self.mean) - self.spread**2 / 2
            return rng.lognormvariate(mu, self.spread)
        values = [tokens for tokens, _ in self.buckets]
        weights = [weight for _, weight in self.buckets]
        return rng.choices(values, weights)[0]

    def text(self) -> str:
        """The text form this distribution parses from."""
        if self.kind == "fixed":
            return f"fixed:{int(self.low)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.low)}-{int(self.high)}"
        if self.kind == "normal":
            return f"normal:mean={self.mean:g},sd={self.spread:g}"
        if self.kind == "lognormal":
            return f"lognormal:mean={self.mean:g},spread={self.spread:g}"
        return "buckets:" + ",".join(f"{tokens}x{weight:g}" for tokens, weight in self.buckets)


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(f"length distribution {text!r}: {why}", f"e.g. {EXAMPLES}")


def _number(
    text: str, value: str, what: str, positive: bool = True, most: float = MAX_LENGTH_TOKENS
) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _bad(text, f"{what} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise _bad(text, f"{what} {value.strip()} is not a finite number")
    if (positive and number <= 0) or number < 0:
        raise _bad(text, f"{what} must be {'positive' if positive else 'at least 0'}, got {value.strip()}")
    if number > most:
        lengths = most == MAX_LENGTH_TOKENS
        why = f" (a request asks for at most {MAX_LENGTH_TOKENS:,} tokens)" if lengths else ""
        raise _bad(text, f"{what} {value.strip()} is above {most:,.0f}{why}")
    return number


def _named(text: str, body: str, names: tuple[str, str]) -> tuple[float, float]:
    fields: dict[str, str] = {}
    for part in body.split(","):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in names:
            raise _bad(text, f"expected {names[0]}=...,{names[1]}=...")
        fields[key.strip()] = value.strip()
    if set(fields) != set(names):
        raise _bad(text, f"expected {names[0]}=...,{names[1]}=...")
    return (
        _number(text, fields[names[0]], names[0]),
        _number(text, fields[names[1]], names[1], positive=False),
    )


def parse_length_distribution(text: str) -> LengthDistribution:
    """The distribution a text names; ConfigError saying what is wrong and showing the forms."""
    kind, colon, body = text.strip().partition(":")
    kind = kind.strip().lower()
    if not colon or not body.strip():
        raise _bad(text, "expected KIND:PARAMETERS")
    body = body.strip()
    if kind == "fixed":
        return LengthDistribution("fixed", low=_number(text, body, "the length"))
    if kind == "uniform":
        low_text, dash, high_text = body.partition("-")
        if not dash:
            raise _bad(text, "expected uniform:LOW-HIGH")
        low, high = _number(text, low_text, "LOW"), _number(text, high_text, "HIGH")
        if high < low:
            raise _bad(text, "HIGH is below LOW")
        return LengthDistribution("uniform", low=low, high=high)
    if kind == "normal":
        mean, sd = _named(text, body, ("mean", "sd"))
        return LengthDistribution("normal", mean=mean, spread=sd)
    if kind == "lognormal":
        mean, spread = _named(text, body, ("mean", "spread"))
        if spread > MAX_LOG_SPREAD:
            why = f"spread {spread:g} is above {MAX_LOG_SPREAD:g} (the sd of the log: 0.8 is a long tail)"
            raise _bad(text, why)
        return LengthDistribution("lognormal", mean=mean, spread=spread)
    if kind == "buckets":
        buckets = []
        for part in body.split(","):
            tokens, x, weight = part.strip().partition("x")
            if not x:
                raise _bad(text, f"bucket {part.strip()!r} is not TOKENSxWEIGHT")
            value = int(_number(text, tokens, "a bucket's tokens"))
            buckets.append((value, _number(text, weight, "a weight", most=MAX_WEIGHT)))
        return LengthDistribution("buckets", buckets=tuple(buckets))
    raise _bad(text, f"unknown kind {kind!r}")
