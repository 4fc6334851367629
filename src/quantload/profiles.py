"""Run profiles: presets that sit between the built-in defaults and the user's own settings."""

from __future__ import annotations

from typing import Any

PROFILE_NAMES: tuple[str, ...] = ("quick", "full", "ci")
# Earlier names still accepted, with the profile each one means.
PROFILE_ALIASES: dict[str, str] = {"seed": "full"}

_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The full protocol (the defaults): 100 prompts at 1, 2, 4, 8 users, three repeats.
    "full": {},
    # About five minutes on a 2-core laptop with SmolLM2-135M.
    "quick": {
        "quality": {"chunks": 4, "kld_chunks": 4},
        "speed": {"prompt_tokens": 128, "gen_tokens": 32, "reps": 2},
        "load": {
            "repeats": 1,
            "prompt_count": 10,
            "max_prompt_tokens": 400,
            "max_tokens": 32,
            "warmup_requests": 1,
            "prefix_requests": 4,
        },
        "kv_types": {"max_tokens": 64},
    },
    # The smallest end-to-end run, for tests on the tiny synthetic model.
    "ci": {
        "quality": {"ctx": 128, "chunks": 2, "kld_chunks": 2},
        "speed": {"prompt_tokens": 32, "gen_tokens": 8, "reps": 1},
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
        },
        "kv_types": {"users": 4, "requests": 8, "max_tokens": 16},
    },
}


def profile_name(name: str) -> str | None:
    """The profile `name` means (an alias resolved), or None when there is no such profile."""
    resolved = PROFILE_ALIASES.get(name, name)
    return resolved if resolved in PROFILE_NAMES else None


def profile_presets(name: str) -> dict[str, dict[str, Any]]:
    """The settings a profile changes, as {section: {key: value}}."""
    return {section: dict(values) for section, values in _PRESETS[name].items()}
