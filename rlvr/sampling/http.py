"""The HTTP core of every client of an OpenAI-compatible server (vLLM sampler, assistant).

`Client` holds what they share: one `requests.Session` per thread, the bearer
token (given, else `$VLLM_API_KEY`, what `launch.serve_vllm --api_key` sets) and
one retry policy. A POST is tried up to `retries + 1` times when the connection
fails or times out, the server answers HTTP 408, 429 or 5xx, or the caller's
`parse` of the answer raises `Aborted` (a request the server dropped, e.g.
finish_reason "abort" from a server shutting down). Between tries it waits
`backoff_s`, then twice as long each time, at most `max_backoff_s`. Any other
4xx raises `Refused` at once (retrying will not help), a body that is not JSON
`NotJSON`, a spent budget `RetriesExhausted` with one `Failure` per try, and a
`stop()`ped client `Stopped`; each caller words these as its own errors.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Callable

import requests

API_KEY_ENV = "VLLM_API_KEY"
MAX_BACKOFF_S = 60.0


def resolve_api_key(explicit: str | None = None) -> str | None:
  """The bearer token: `explicit`, else `$VLLM_API_KEY`, else None (no header)."""
  return explicit or os.environ.get(API_KEY_ENV) or None


def auth_headers(token: str | None) -> dict[str, str]:
  """The bearer-token header for `token` (none for None or "")."""
  return {"Authorization": f"Bearer {token}"} if token else {}


def retryable(status: int) -> bool:
  """Whether an HTTP status is worth another try (timeout, rate limit, server failure)."""
  return status in (408, 429) or status >= 500


def check_retry_settings(
  request_timeout_s: float, retries: int, backoff_s: float, prefix: str = ""
) -> None:
  """Raises ValueError naming the first bad setting (`prefix` + its name)."""
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  for name, value, ok, need in (
    (
      "request_timeout_s",
      request_timeout_s,
      number(request_timeout_s) and request_timeout_s > 0,
      "a number > 0",
    ),
    (
      "retries",
      retries,
      number(retries) and isinstance(retries, int) and retries >= 0,
      "an int >= 0",
    ),
    ("backoff_s", backoff_s, number(backoff_s) and backoff_s >= 0, "a number >= 0"),
  ):
    if not ok:
      raise ValueError(f"{prefix}{name}: must be {need}, got {value!r}")


def short_error(e: Exception) -> str:
  """An exception's message on one line, at most ~300 characters."""
  text = " ".join(str(e).split())
  return text if len(text) < 300 else text[:300] + "..."


def server_message(r: requests.Response) -> str:
  """The error message of a server's answer (OpenAI's error.message, else the body)."""
  try:
    body = r.json()
    msg = body.get("error", body) if isinstance(body, dict) else body
    msg = msg.get("message", msg) if isinstance(msg, dict) else msg
    return short_error(Exception(str(msg)))
  except ValueError:
    return short_error(Exception(r.text or r.reason or ""))


@dataclasses.dataclass(frozen=True)
class Failure:
  """One failed try: `kind` is "connection", "timeout", "status" or "aborted"; `label` is
  short ("ConnectionError", "HTTP 503", "aborted"), `detail` says more."""

  kind: str
  label: str
  detail: str
  status: int | None = None


class RequestFailed(Exception):
  """A POST that gave no usable answer."""


class Refused(RequestFailed):
  """HTTP 4xx other than 408/429: the request itself is wrong (never retried)."""

  def __init__(self, status: int, message: str, text: str):
    super().__init__(f"HTTP {status}: {message}")
    self.status, self.message, self.text = status, message, text


class NotJSON(RequestFailed):
  """A success status whose body is not JSON."""

  def __init__(self, text: str):
    super().__init__(f"body is not JSON: {text[:200]!r}")
    self.text = text


class RetriesExhausted(RequestFailed):
  """Every try failed in a retryable way; `failures` holds one Failure per try."""

  def __init__(self, failures: list[Failure]):
    super().__init__(f"{len(failures)} tries: {', '.join(f.label for f in failures)}")
    self.failures = failures


class Stopped(RequestFailed):
  """The client was stopped (`Client.stop`) before the request got an answer."""


class Aborted(Exception):
  """Raised by a `parse` callback when the server dropped the request: tried again."""


class Client:
  """Sessions, auth header and the retry policy for one caller (thread-safe)."""

  def __init__(
    self,
    *,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    retries: int = 3,
    backoff_s: float = 1.0,
    max_backoff_s: float = MAX_BACKOFF_S,
  ):
    self.headers = auth_headers(resolve_api_key(api_key))
    self.timeout_s, self.retries = timeout_s, retries
    self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
    self.attempts = 0  # POST tries sent, over all threads
    self.stopped = threading.Event()  # set by stop(): waits end, new tries are refused
    self._lock = threading.Lock()
    self._local = threading.local()

  def session(self) -> requests.Session:
    """This thread's session (connections are kept alive per thread)."""
    if not hasattr(self._local, "session"):
      self._local.session = requests.Session()
    return self._local.session

  def delay(self, attempt: int) -> float:
    """Seconds to wait before try `attempt` (1 = the first retry)."""
    return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))

  def get(self, url: str, timeout: float) -> requests.Response:
    """One GET with the auth header (no retries; requests' exceptions propagate)."""
    return self.session().get(url, headers=self.headers, timeout=timeout)

  def post(
    self,
    url: str,
    payload: dict,
    *,
    timeout: float | None = None,
    parse: Callable[[Any], Any] | None = None,
  ) -> Any:
    """POST with the retry policy; the JSON body (None when empty), or what `parse`
    makes of it. Raises a RequestFailed (see the module docstring)."""
    timeout = timeout or self.timeout_s
    failures: list[Failure] = []
    for attempt in range(self.retries + 1):
      if attempt:
        self.stopped.wait(self.delay(attempt))
      if self.stopped.is_set():
        raise Stopped(f"{url}: stopped after an earlier failure")
      with self._lock:
        self.attempts += 1
      failure, result = self._try(url, payload, timeout, parse)
      if failure is None:
        return result
      failures.append(failure)
    raise RetriesExhausted(failures)

  def _try(
    self, url: str, payload: dict, timeout: float, parse: Callable[[Any], Any] | None
  ) -> tuple[Failure | None, Any]:
    """One try: (None, result), or (the Failure, None) when it is worth another."""
    try:
      r = self.session().post(url, json=payload, headers=self.headers, timeout=timeout)
    except requests.Timeout as e:
      return Failure("timeout", type(e).__name__, f"no answer within {timeout:g}s"), None
    except requests.RequestException as e:
      return Failure("connection", type(e).__name__, short_error(e)), None
    if retryable(r.status_code):
      label = f"HTTP {r.status_code}"
      return Failure("status", label, f"{label}: {server_message(r)}", r.status_code), None
    if r.status_code >= 400:
      raise Refused(r.status_code, server_message(r), r.text)
    try:
      body = r.json() if r.content else None
    except ValueError:
      raise NotJSON(r.text) from None
    if parse is None:
      return None, body
    try:
      return None, parse(body)
    except Aborted:
      return Failure("aborted", "aborted", "request aborted by the server"), None

  def stop(self) -> None:
    """Ends waits between tries and refuses new ones (other threads give up quickly)."""
    self.stopped.set()
