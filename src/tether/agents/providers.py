"""What the model adapters (`OpenAIChat`, `AnthropicMessages`) share: how a provider's failure
becomes a Tether error, how a Retry-After header is read, and how a tool call's streamed JSON
becomes its arguments. It imports no provider SDK.

A model call is a checkpointed step whose retries are durable, so the SDKs' own retries are
off and every failure is sorted here into retried or not:

    provider answer            error           the model step
    429                        RateLimited     retries, not before the Retry-After it was told
    408, 409, 5xx, 529         ModelError      retries with its backoff
    no answer, timeout, a      ModelError      retries with its backoff
      stream broken midway
    other 4xx (bad key,        ModelRefused    fails at once (a PermanentError); the message
      unknown model, bad                       names what to fix
      request)
"""

from __future__ import annotations

import email.utils
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tether.agents.models import ModelError, RateLimited
from tether.errors import PermanentError

RETRIED_STATUSES = frozenset({408, 409, 429})  # and every status >= 500


class ModelRefused(ModelError, PermanentError):
    """The model's provider refused the request as made (key, model or request); it is never
    retried: fix what the message names, then start the run again."""


@dataclass(frozen=True, slots=True)
class Provider:
    """Who is being called, for error messages that say what to fix."""

    adapter: str  # "OpenAIChat"
    model: str
    base_url: str
    key_variable: str  # the environment variable the SDK reads the API key from

    def __str__(self) -> str:
        return f"{self.adapter}({self.model!r}) at {self.base_url}"


def status_error(
    provider: Provider, status: int, headers: Mapping[str, str], detail: str
) -> ModelError:
    """The Tether error for an HTTP error answer of the provider."""
    detail = _shorten(detail)
    if status == 429:
        wait = retry_after(headers)
        told = f"; it asked to wait {wait:g} s" if wait is not None else ""
        return RateLimited(f"{provider} is rate limited (429){told}: {detail}", retry_after=wait)
    if status >= 500 or status in RETRIED_STATUSES or status < 400:
        return ModelError(f"{provider} failed ({status}): {detail}; the model call is retried")
    if status == 401:
        fix = f"set {provider.key_variable} or pass api_key= to {provider.adapter}"
    elif status == 403:
        fix = f"check that the API key may use the model {provider.model!r}"
    elif status == 404:
        fix = f"check the model name {provider.model!r} and the base_url {provider.base_url}"
    else:
        fix = "fix the request: the model options, the tools' parameter schemas or the messages"
    return ModelRefused(f"{provider} refused the request ({status}): {detail}; {fix}")


def unreachable(provider: Provider, exc: BaseException) -> ModelError:
    return ModelError(f"{provider} could not be reached ({exc}); the model call is retried")


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the provider asked to wait: `retry-after-ms`, else `retry-after` in seconds or
    as an HTTP date (counted from the answer's own `date` header when it has one)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    when = _http_date(headers.get("retry-after"))
    if when is None:
        return None
    sent = _http_date(headers.get("date")) or datetime.now(UTC)
    return max(0.0, (when - sent).total_seconds())


def tool_arguments(name: str, text: str, *, truncated: bool = False) -> dict[str, Any]:
    """A tool call's arguments from the JSON text the model streamed; text that is not a JSON
    object fails the model call (retried: the model usually writes it right next time)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if truncated:
            raise ModelRefused(
                f"the model's arguments for the tool {name!r} were cut off at max_tokens: "
                f"raise max_tokens= on the model"
            ) from None
        raise ModelError(
            f"the model's arguments for the tool {name!r} are not valid JSON ({exc}): "
            f"{_shorten(text)!r}; the model call is retried"
        ) from None
    if not isinstance(value, dict):
        raise ModelError(
            f"the model's arguments for the tool {name!r} are not a JSON object: "
            f"{_shorten(text)!r}; the model call is retried"
        )
    return value


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _shorten(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


__all__ = ["ModelRefused", "Provider", "retry_after", "status_error", "tool_arguments"]
