"""An OpenAI-compatible chat client as `complete(prompts) -> texts`: the assistant
and teacher models of the data-synthesis methods (Composition-RL's composer,
QbQ's teacher) behind any vLLM / OpenAI-style server, with bounded concurrency,
clear errors, and `rlvr.sampling.http`'s sessions, retries and API key.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
from typing import Callable, Sequence

import requests

from rlvr.sampling import http


class AssistantError(RuntimeError):
  """The assistant server cannot be used (unreachable, failing, refusing auth/model)."""


class _BadRequest(Exception):
  """HTTP 400/413/422: the server refused this one request (not retried)."""


class Assistant:
  """`complete(prompts) -> texts` against an OpenAI-compatible server.

  A prompt is sent as one user chat message; if the server answers that the
  model has no chat template, it switches (once, for all later requests) to
  /v1/completions with the raw text. Failed requests are retried `retries` times
  by the HTTP core's policy, then raise AssistantError naming the URL; so do
  401/403/404 at once. A request the server refuses as bad (400/413/422, e.g. a
  prompt longer than the context) yields "" (which the composition rejects) and
  its message goes to `on_error`. The API key is `api_key`, else `$VLLM_API_KEY`.
  """

  def __init__(
    self,
    url: str,
    model: str,
    *,
    api_key: str | None = None,
    temperature: float = 0.1,
    top_p: float = 0.7,
    max_tokens: int = 4096,
    timeout_s: float = 600.0,
    retries: int = 3,
    concurrency: int = 16,
    backoff_s: float = 1.0,
  ):
    base = url.rstrip("/")
    self.base = base[:-3] if base.endswith("/v1") else base
    self.model = model
    self.sampling = dict(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    self.timeout_s, self.concurrency = timeout_s, concurrency
    self.mode = "chat"  # "completions" once the model proves to have no template
    self.refused = 0  # 400/413/422 answers
    self.http = http.Client(
      api_key=api_key, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s
    )
    self._lock = threading.Lock()
    self._pool: cf.ThreadPoolExecutor | None = None

  @property
  def requests(self) -> int:
    """Requests sent so far, retries included."""
    return self.http.attempts

  def check(self) -> None:
    """Fails fast (AssistantError) when the server is unreachable, lacks the model, or
    refuses a one-line prompt with these settings. Finds out chat vs completions."""
    url = f"{self.base}/v1/models"
    try:
      r = self.http.get(url, timeout=min(self.timeout_s, 30))
    except requests.RequestException as e:
      raise AssistantError(f"cannot reach {url}: {http.short_error(e)}") from None
    if r.status_code != 200:
      raise AssistantError(f"{url}: HTTP {r.status_code}: {http.server_message(r)}")
    try:
      served = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
      return  # a server without a standard model list; requests will tell
    if self.model not in served:
      raise AssistantError(
        f"{url}: no model {self.model!r} (served: {', '.join(served)}); pass --model"
      )
    # A refusal of a one-line prompt is about the settings (e.g. max_tokens beyond the
    # served context), not about one composition: stop before rejecting them all.
    try:
      self._ask("Reply with the word OK.")
    except _BadRequest as e:
      raise AssistantError(
        f"{self.base} refuses even a one-line prompt with these sampling settings: {e}"
      ) from None

  def _post(self, endpoint: str, payload: dict, kind: str) -> str:
    """The text of one answer (a `kind` = "chat" | "completions" request)."""
    url = f"{self.base}{endpoint}"
    try:
      return self.http.post(url, payload, parse=lambda out: _text(out, kind, self.base))
    except http.Refused as e:
      if e.status in (400, 413, 422):
        raise _BadRequest(e.message) from None
      raise AssistantError(f"{url}: {e}") from None
    except http.NotJSON as e:
      raise AssistantError(f"{url}: {e}") from None
    except http.Stopped as e:
      raise AssistantError(str(e)) from None
    except http.RetriesExhausted as e:
      raise AssistantError(
        f"{url}: failed after {len(e.failures)} tries: {e.failures[-1].detail}"
      ) from None

  def _ask(self, prompt: str) -> str:
    """One completion; _BadRequest when the server refuses it."""
    if self.mode == "chat":
      try:
        return self._post(
          "/v1/chat/completions",
          dict(model=self.model, messages=[{"role": "user", "content": prompt}], **self.sampling),
          "chat",
        )
      except _BadRequest as e:
        if "chat template" not in str(e).lower() and "chat_template" not in str(e).lower():
          raise
        with self._lock:
          if self.mode == "chat":
            self.mode = "completions"
            sys.stderr.write(
              f"assistant {self.base}: the model has no chat template; "
              "sending raw prompts to /v1/completions\n"
            )
    return self._post(
      "/v1/completions", dict(model=self.model, prompt=prompt, **self.sampling), "completions"
    )

  def complete_one(self, prompt: str, on_error: Callable[[str], None] | None = None) -> str:
    try:
      return self._ask(prompt)
    except _BadRequest as e:
      with self._lock:
        self.refused += 1
        first = self.refused == 1
      if first:
        sys.stderr.write(
          f"assistant {self.base} refused a request ({e}); its "
          "answer is empty (the caller rejects it)\n"
        )
      if on_error:
        on_error(str(e))
      return ""

  def complete(
    self, prompts: Sequence[str], on_error: Callable[[str], None] | None = None
  ) -> list[str]:
    """Texts for prompts, in order; a batch runs `concurrency` requests at a time."""
    if len(prompts) <= 1:
      return [self.complete_one(p, on_error) for p in prompts]
    with self._lock:
      if self._pool is None:
        self._pool = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="assistant")
    return list(self._pool.map(lambda p: self.complete_one(p, on_error), prompts))

  def close(self) -> None:
    self.http.stop()
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)


def _text(out: dict, kind: str, base: str) -> str:
  """The first choice's text; http.Aborted (tried again) when the server dropped it."""
  try:
    choice = out["choices"][0]
    if choice.get("finish_reason") == "abort":
      raise http.Aborted()
    return (choice["message"]["content"] if kind == "chat" else choice["text"]) or ""
  except (KeyError, IndexError, TypeError, AttributeError):
    raise AssistantError(f"{base}: unexpected {kind} response {str(out)[:200]!r}") from None
