"""A served model as every part of quantload names it: the exporter's series, the load's plans and
records, the report's rows.

`ServedTarget` is the one description: the `server` label, the quantization, the model name sent
in requests, the base URL, and the API key. The key is excluded from every dump and repr, so it
can never land in a plan, a record or a log line; the load processes get it from the environment.

The naming rules live here and nowhere else: a quantization's server is called
`server_name(quant)` ("llama-q4_k_m") and its llama-server is started with
`server_alias(model, quant)` ("smollm2-135m-Q4_K_M"), which `model_of_alias` undoes.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from quantload.errors import ConfigError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
SERVER_PREFIX = "llama-"


def server_name(quant: str) -> str:
    """The `server` label of the llama-server that serves `quant`: "llama-" + quant in lower case."""
    return f"{SERVER_PREFIX}{quant.lower()}"


def server_alias(model: str, quant: str) -> str:
    """The alias a llama-server of `model` at `quant` is started with (its answers' `model`)."""
    return f"{model}-{quant}"


def model_of_alias(alias: str, quant: str) -> str:
    """The model name inside an alias made by `server_alias` (the alias itself if it is not one)."""
    return alias.removesuffix(f"-{quant}")


class ServedTarget(BaseModel):
    """One llama-server (or any OpenAI-style server) as the exporter, the load and the report see it.

    `quant` and `model` may be "" where they are not known yet (the exporter then reads them from
    the server's `/props`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    quant: str = ""
    model: str = ""
    url: str
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)

    @field_validator("name")
    @classmethod
    def _usable_name(cls, name: str) -> str:
        if not NAME_PATTERN.match(name):
            raise ConfigError(
                f"server name {name!r} is not usable as a label",
                "use letters, digits, '_', '-' or '.'",
            )
        return name

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"{url!r} is not an http(s) URL",
                "give the server's base URL, e.g. http://127.0.0.1:8080",
            )
        return url.rstrip("/")

    @classmethod
    def for_quant(cls, quant: str, model: str, url: str, api_key: str | None = None) -> ServedTarget:
        """The target of the server quantload started for `quant` (named by `server_name`)."""
        secret = SecretStr(api_key) if api_key else None
        return cls(name=server_name(quant), quant=quant, model=model, url=url, api_key=secret)

    @property
    def api_key_text(self) -> str | None:
        """The API key in clear, for the one place that sends it (an Authorization header)."""
        return self.api_key.get_secret_value() if self.api_key is not None else None

    def endpoint(self, path: str) -> str:
        """The full URL of one of the server's endpoints, e.g. `/metrics`."""
        return f"{self.url}{path}"
