"""Run profiles: presets that sit between the built-in defaults and the user's own settings."""

from __future__ import annotations

from typing import Any

PROFILE_NAMES: tuple[str, ...] = ("quick", "full", "ci", "wide")
# Earlier names still accepted, with the profile each one means.
PROFILE_ALIASES: dict[str, str] = {"seed": "full"}

_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The full protocol (the defaults): 100 prompts at 1, 2, 4, 8 users, three repeats, the prompt
    # cache, multi-turn sessions, the mixed-traffic diagnosis, both limit searches (open loop
    # and trace replay where rates or a trace are given) and the KV-cache type trade-off.
    "full": {},
    # A few minutes on a 2-core laptop with SmolLM2-135M: the sweep, the prompt cache, a search
    # for the most users capped at 45 s a quantization and the KV-cache type trade-off (and the
    # soak, in every profile, when a duration is given: soak.duration_s, `--duration`). A level
    # sends for at most 10 s while undecided: where a p99 needs more requests than that, the
    # quick profile says undecided rather than guess.
    "quick": {
        "sensitivity": {"in_run": False},
        "quality": {"chunks": 4, "kld_chunks": 4},
        "speed": {"prompt_tokens": 128, "gen_tokens": 32, "reps": 2},
        "load": {
            "repeats": 1,
            "prompt_count": 10,
            "max_prompt_tokens": 400,
            "max_tokens": 32,
            "warmup_requests": 1,
            "prefix_requests": 4,
            "experiments": ("sweep", "prefix_cache", "limit_users", "kv_types", "soak"),
        },
        "slo": {"level_max_s": 10.0},
        "limit": {
            "max_users": 16,
            "time_cap_s": 45.0,
            "requests_per_user": 2,
            "min_requests": 4,
            "trial_timeout_s": 120.0,
        },
        "kv_types": {"max_tokens": 64},
    },
    # The smallest end-to-end run, for tests on the tiny synthetic model.
    "ci": {
        "sensitivity": {"in_run": False},
        "prepare": {"imatrix_chunks": 2, "imatrix_ctx": 128},
        "quality": {"ctx": 128, "chunks": 2, "kld_chunks": 2},
        "speed": {"prompt_tokens": 32, "gen_tokens": 8, "reps": 1},
        "predict": {"requests_per_level": 100, "repeats": 1},
        "server": {"slots": 4, "ctx_per_slot": 2048},
        "load": {
            "users": (1, 2),
            "repeats": 2,
            "prompt_count": 4,
            "max_prompt_tokens": 200,
            "max_tokens": 8,
            "warmup_requests": 1,
            "prefix_tokens": 300,
            "prefix_requests": 3,
            "experiments": ("sweep", "prefix_cache", "sessions", "mixed", "limit_users", "kv_types", "soak"),
        },
        "sessions": {
            "users": 1,
            "count": 2,
            "turns": 2,
            "think_time_s": 0.0,
            "turn_tokens": "uniform:10-30",
            "reply_tokens": "fixed:8",
            "cache_modes": (True,),
        },
        "mixed": {
            "users": 2,
            "decode_requests": 4,
            "decode_prompt_tokens": 32,
            "decode_output_tokens": 16,
            "long_prompt_tokens": 600,
            "long_output_tokens": 4,
            "long_fraction": 0.34,
            "batch_sizes": ("2048/512", "64/64"),
        },
        "slo": {"level_max_s": 3.0},
        "limit": {
            "max_users": 4,
            "time_cap_s": 20.0,
            "requests_per_user": 2,
            "min_requests": 4,
            "trial_timeout_s": 60.0,
        },
        "kv_types": {"users": 4, "requests": 8, "max_tokens": 16},
    },
}


# The quick protocol over the types people choose among: seven files, IQ4_XS with an importance
# matrix computed on WikiText-2's train split (prepare.calibration).
_PRESETS["wide"] = {
    **{section: dict(values) for section, values in _PRESETS["quick"].items()},
    "prepare": {
        "quants": ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS-imatrix", "Q3_K_M"),
        "imatrix": "computed",
    },
}


def profile_name(name: str) -> str | None:
    """The profile `name` means (an alias resolved), or None when there is no such profile."""
    resolved = PROFILE_ALIASES.get(name, name)
    return resolved if resolved in PROFILE_NAMES else None


def profile_presets(name: str) -> dict[str, dict[str, Any]]:
    """The settings a profile changes, as {section: {key: value}}."""
    return {section: dict(values) for section, values in _PRESETS[name].items()}
