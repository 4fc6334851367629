"""The prompt-cache experiment's server side: a system prompt of an exact token length, slot reset.

The system prompt is cut from a built-in handbook text to `target_tokens` +/- 2 %, counted with
the target server's own `/tokenize`, so the length holds for whatever model the server runs.
"""

from __future__ import annotations

__all__ = ["build_system_prompt", "count_tokens", "erase_slots"]

from importlib import resources

import httpx

from quantload.errors import ServerError
from quantload.http_errors import said

TOLERANCE = 0.02


def _base_words() -> list[str]:
    text = resources.files("quantload").joinpath("data", "system_prompt.txt").read_text("utf-8")
    return text.split()


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def count_tokens(client: httpx.Client, url: str, text: str, api_key: str | None = None) -> int:
    """Tokens of `text` by the server's tokenizer (POST /tokenize)."""
    try:
        response = client.post(
            f"{url.rstrip('/')}/tokenize", json={"content": text}, headers=_headers(api_key)
        )
    except httpx.HTTPError as error:
        raise ServerError(f"cannot reach {url}/tokenize: {said(error)}", "is the server up?") from None
    if response.status_code != 200:
        raise ServerError(
            f"{url}/tokenize answered HTTP {response.status_code}",
            "the prompt-cache experiment needs llama-server's /tokenize",
        )
    tokens = response.json().get("tokens")
    if not isinstance(tokens, list):
        raise ServerError(f"{url}/tokenize returned no token list")
    return len(tokens)


def build_system_prompt(
    url: str, target_tokens: int, api_key: str | None = None, timeout_s: float = 30.0
) -> tuple[str, int]:
    """A system prompt of `target_tokens` (+/- 2 %) by the server's count: (text, tokens)."""
    base = _base_words()
    words: list[str] = []
    section = 0
    while len(words) < target_tokens * 2:  # English runs ~1.3 tokens a word: plenty
        section += 1
        words += [f"Section {section}.", *base]
    with httpx.Client(timeout=timeout_s) as client:
        low, high = 1, len(words)
        best: tuple[str, int] | None = None
        while low <= high:
            middle = (low + high) // 2
            text = " ".join(words[:middle])
            count = count_tokens(client, url, text, api_key)
            if best is None or abs(count - target_tokens) < abs(best[1] - target_tokens):
                best = (text, count)
            if count < target_tokens:
                low = middle + 1
            elif count > target_tokens:
                high = middle - 1
            else:
                break
    assert best is not None
    if abs(best[1] - target_tokens) > TOLERANCE * target_tokens:
        raise ServerError(
            f"could not build a {target_tokens}-token system prompt (closest: {best[1]})",
            "check the server's /tokenize",
        )
    return best


def erase_slots(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """Empty every slot's cached prompt when the server allows it; say what state that left."""
    headers = _headers(api_key)
    base = url.rstrip("/")
    try:
        with httpx.Client(timeout=timeout_s) as client:
            slots = client.get(f"{base}/slots", headers=headers)
            if slots.status_code != 200:
                return f"slots unknown (/slots answered HTTP {slots.status_code})"
            count = len(slots.json())
            for slot in range(count):
                answer = client.post(f"{base}/slots/{slot}", params={"action": "erase"}, headers=headers)
                if answer.status_code != 200:
                    return (
                        f"slots not erased (HTTP {answer.status_code}; llama-server needs"
                        " --slot-save-path for slot actions)"
                    )
    except (httpx.HTTPError, ValueError) as error:
        return f"slots not erased ({error})"
    return f"{count} slots erased"
