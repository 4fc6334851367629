"""Prompts of an exact token length, made with the target server's own tokenizer.

GGUF users rarely have the model's Hugging Face tokenizer, and they need none: llama-server's
`/tokenize` and `/detokenize` are the model's own. A corpus (the built-in handbook and prompt texts)
is tokenized once; a prompt of N tokens is a short unique header ("Request 17.") and a slice of the
corpus ids turned back into text at an offset of its own, then counted again and trimmed or
lengthened until the count is N (a few tokens may merge at the seams, so the slice is adjusted,
not assumed).

The chat template adds tokens of its own around a user turn (SmolLM2's adds a default system
prompt: 30 tokens). `template_overhead` measures them once with `/apply-template` (the prompt the
server would build) and `/tokenize`, so a workload that asks for a prompt of N tokens sends a user
turn of N minus the overhead and `usage.prompt_tokens` comes back as N.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any, Protocol

import httpx

from quantload import json_input
from quantload.errors import ServerError
from quantload.http_errors import said

PROBE_TEXT = "Hello there, how are you today?"
MAX_ADJUSTMENTS = 6


class Tokenizer(Protocol):
    """A model's tokenizer as a server exposes it."""

    def tokenize(self, text: str, add_special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def apply_template(self, messages: list[dict[str, str]]) -> str: ...


class ServerTokenizer:
    """llama-server's /tokenize, /detokenize, /apply-template and /props over one HTTP client."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._sends_key = bool(api_key)
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._client.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as error:
            raise ServerError(f"cannot reach {self.url}{path}: {said(error)}", "is the server up?") from None
        if response.status_code in (401, 403):
            raise ServerError(
                f"{self.url}{path} answered HTTP {response.status_code}: the server "
                + ("refused the API key quantload sent" if self._sends_key else "wants an API key"),
                "give the server's key: QUANTLOAD_SERVER__API_KEY, or --api-key-env VARIABLE naming"
                " the environment variable that holds it",
            )
        if response.status_code != 200:
            raise ServerError(
                f"{self.url}{path} answered HTTP {response.status_code}",
                "synthetic prompts need llama-server's /tokenize, /detokenize and /apply-template",
            )
        try:
            answer = json_input.loads(response.content)
        except ValueError:
            raise ServerError(f"{self.url}{path} did not answer JSON") from None
        if not isinstance(answer, dict):
            raise ServerError(f"{self.url}{path} answered JSON that is not an object")
        return answer

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        tokens = self._post("/tokenize", {"content": text, "add_special": add_special}).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ServerError(f"{self.url}/tokenize returned no token list")
        return tokens

    def detokenize(self, tokens: Sequence[int]) -> str:
        content = self._post("/detokenize", {"tokens": list(tokens)}).get("content")
        if not isinstance(content, str):
            raise ServerError(f"{self.url}/detokenize returned no text")
        return content

    def apply_template(self, messages: list[dict[str, str]]) -> str:
        prompt = self._post("/apply-template", {"messages": messages}).get("prompt")
        if not isinstance(prompt, str):
            raise ServerError(f"{self.url}/apply-template returned no prompt")
        return prompt

    def slots_and_context(self) -> tuple[int | None, int | None]:
        """The server's slot count and per-slot context from /props; None where it does not say."""
        try:
            response = self._client.get(f"{self.url}/props")
            props = json_input.loads(response.content) if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return None, None
        slots = props.get("total_slots") if isinstance(props, dict) else None
        settings = props.get("default_generation_settings") if isinstance(props, dict) else None
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return (
            slots if isinstance(slots, int) and slots > 0 else None,
            n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServerTokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def template_overhead(tokenizer: Tokenizer) -> int:
    """Tokens the chat template adds around one user turn (the whole prompt as the server builds
    it, special tokens included, minus the turn's own tokens)."""
    prompt = tokenizer.apply_template([{"role": "user", "content": PROBE_TEXT}])
    whole = len(tokenizer.tokenize(prompt, add_special=True))
    return max(whole - len(tokenizer.tokenize(PROBE_TEXT)), 0)


def corpus_text() -> str:
    """The text synthetic prompts are cut from: the built-in handbook and prompts."""
    data = resources.files("quantload").joinpath("data")
    parts = [data.joinpath("system_prompt.txt").read_text("utf-8")]
    with data.joinpath("prompts.jsonl").open("r", encoding="utf-8") as handle:
        parts += [str(json.loads(line)["prompt"]) for line in handle if line.strip()]
    return "\n".join(parts)


class PromptMaker:
    """User turns of an exact token count, each one different (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, overhead_tokens: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.overhead_tokens = template_overhead(tokenizer) if overhead_tokens is None else overhead_tokens
        self._corpus = tokenizer.tokenize(corpus_text())
        if len(self._corpus) < 64:
            raise ServerError("the server's /tokenize made almost nothing of the prompt corpus")

    def _slice(self, start: int, count: int) -> list[int]:
        corpus = self._corpus
        out: list[int] = []
        position = start % len(corpus)
        while len(out) < count:
            take = min(count - len(out), len(corpus) - position)
            out += corpus[position : position + take]
            position = 0
        return out

    def user_text(self, tokens: int, index: int) -> tuple[str, int]:
        """A user turn of `tokens` tokens (counted alone), the `index`-th of its kind: (text, count).

        The count is exact unless the tokenizer keeps merging at the seams; then it is the closest
        one found (within a token or two).
        """
        if tokens < 1:
            raise ValueError("a prompt needs at least one token")
        header = f"Request {index}." if tokens >= 8 else ""
        start = (index * 7919) % len(self._corpus)
        body = max(tokens - (len(self.tokenizer.tokenize(header)) if header else 0), 0)
        best: tuple[str, int] | None = None
        for _ in range(MAX_ADJUSTMENTS):
            piece = self.tokenizer.detokenize(self._slice(start, body)) if body else ""
            text = f"{header} {piece.strip()}".strip() if header else piece
            count = len(self.tokenizer.tokenize(text))
            if best is None or abs(count - tokens) < abs(best[1] - tokens):
                best = (text, count)
            if count == tokens:
                break
            body = max(body + tokens - count, 0)
        assert best is not None
        return best

    def whole_prompt_tokens(self, text: str) -> int:
        """Tokens of the whole prompt the server builds around the user turn `text`."""
        prompt = self.tokenizer.apply_template([{"role": "user", "content": text}])
        return len(self.tokenizer.tokenize(prompt, add_special=True))

    def prompt(self, prompt_tokens: int, index: int) -> tuple[str, int]:
        """A user turn whose whole templated prompt is `prompt_tokens` tokens: (text, its tokens).

        The turn is made to the length the template leaves, then the whole prompt is counted as
        the server builds it; a token lost or gained where the turn meets the template is made up
        once.
        """
        content = prompt_tokens - self.overhead_tokens
        if content < 1:
            raise ValueError(
                f"{prompt_tokens} prompt tokens leave no room for a user turn: the chat template"
                f" alone takes {self.overhead_tokens}"
            )
        text, count = self.user_text(content, index)
        whole = self.whole_prompt_tokens(text)
        if whole != prompt_tokens and content + prompt_tokens - whole >= 1:
            retry, retry_count = self.user_text(content + prompt_tokens - whole, index)
            retried = self.whole_prompt_tokens(retry)
            if abs(retried - prompt_tokens) < abs(whole - prompt_tokens):
                return retry, retry_count
        return text, count

    @property
    def smallest_prompt_tokens(self) -> int:
        """The shortest whole prompt `prompt` can make: the template's tokens plus one."""
        return self.overhead_tokens + 1
