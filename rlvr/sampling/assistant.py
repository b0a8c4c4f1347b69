"""An OpenAI-compatible chat client as `complete(prompts) -> texts`: the assistant
and teacher models of the data-synthesis methods (Composition-RL's composer,
QbQ's teacher) behind any vLLM / OpenAI-style server, with bounded concurrency,
retries and clear errors.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
from typing import Callable, Sequence


class AssistantError(RuntimeError):
  """The assistant server cannot be used (unreachable, failing, refusing auth/model)."""


class _BadRequest(Exception):
  """HTTP 400/413/422: the server refused this one request (not retried)."""


class Assistant:
  """`complete(prompts) -> texts` against an OpenAI-compatible server.

  A prompt is sent as one user chat message; if the server answers that the
  model has no chat template, it switches (once, for all later requests) to
  /v1/completions with the raw text. Connection errors, timeouts, 429 and 5xx
  are retried `retries` times with exponential backoff, then raise
  AssistantError naming the URL; so do 401/403/404 at once. A request the
  server refuses as bad (400/413/422, e.g. a prompt longer than the context)
  yields "" (which the composition rejects) and its message goes to `on_error`.
  """

  def __init__(self, url: str, model: str, *, api_key: str | None = None,
               temperature: float = 0.1, top_p: float = 0.7, max_tokens: int = 4096,
               timeout_s: float = 600.0, retries: int = 3, concurrency: int = 16,
               backoff_s: float = 1.0):
    base = url.rstrip("/")
    self.base = base[:-3] if base.endswith("/v1") else base
    self.model, self.api_key = model, api_key
    self.sampling = dict(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
    self.concurrency = concurrency
    self.mode = "chat"                 # "completions" once the model proves to have no template
    self.requests = 0
    self.refused = 0                   # 400/413/422 answers
    self.stopped = threading.Event()   # set on a fatal error: other threads give up quickly
    self._lock = threading.Lock()
    self._local = threading.local()
    self._pool: cf.ThreadPoolExecutor | None = None

  def _session(self):
    import requests
    if not hasattr(self._local, "session"):
      self._local.session = requests.Session()
    return self._local.session

  def _headers(self) -> dict[str, str]:
    return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

  def check(self) -> None:
    """Fails fast (AssistantError) when the server is unreachable, lacks the model, or
    refuses a one-line prompt with these settings. Finds out chat vs completions."""
    import requests
    url = f"{self.base}/v1/models"
    try:
      r = self._session().get(url, headers=self._headers(), timeout=min(self.timeout_s, 30))
    except requests.RequestException as e:
      raise AssistantError(f"cannot reach {url}: {short_error(e)}") from None
    if r.status_code != 200:
      raise AssistantError(f"{url}: HTTP {r.status_code}: {_server_message(r)}")
    try:
      served = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
      return   # a server without a standard model list; requests will tell
    if self.model not in served:
      raise AssistantError(f"{url}: no model {self.model!r} (served: {', '.join(served)}); "
                           "pass --model")
    # A refusal of a one-line prompt is about the settings (e.g. max_tokens beyond the
    # served context), not about one composition: stop before rejecting them all.
    try:
      self._ask("Reply with the word OK.")
    except _BadRequest as e:
      raise AssistantError(f"{self.base} refuses even a one-line prompt with these sampling "
                           f"settings: {e}") from None

  def _post(self, endpoint: str, payload: dict) -> dict:
    import requests
    url = f"{self.base}{endpoint}"
    last = ""
    for attempt in range(self.retries + 1):
      if self.stopped.is_set():
        raise AssistantError(f"{url}: stopped after an earlier failure")
      with self._lock:
        self.requests += 1
      try:
        r = self._session().post(url, json=payload, headers=self._headers(),
                                 timeout=self.timeout_s)
      except requests.Timeout:
        last = f"no answer within {self.timeout_s:g}s"
      except requests.RequestException as e:
        last = short_error(e)
      else:
        if r.status_code == 200:
          try:
            return r.json()
          except ValueError:
            last = f"HTTP 200 with a body that is not JSON: {r.text[:200]!r}"
        elif r.status_code in (400, 413, 422):
          raise _BadRequest(_server_message(r))
        elif r.status_code in (408, 429) or r.status_code >= 500:
          last = f"HTTP {r.status_code}: {_server_message(r)}"
        else:
          raise AssistantError(f"{url}: HTTP {r.status_code}: {_server_message(r)}")
      if attempt < self.retries and self.stopped.wait(min(60.0, self.backoff_s * 2 ** attempt)):
        break
    raise AssistantError(f"{url}: failed after {self.retries + 1} tries: {last}")

  def _ask(self, prompt: str) -> str:
    """One completion; _BadRequest when the server refuses it."""
    if self.mode == "chat":
      try:
        out = self._post("/v1/chat/completions", dict(
            model=self.model, messages=[{"role": "user", "content": prompt}], **self.sampling))
        return _text(out, "chat", self.base)
      except _BadRequest as e:
        if "chat template" not in str(e).lower() and "chat_template" not in str(e).lower():
          raise
        with self._lock:
          if self.mode == "chat":
            self.mode = "completions"
            sys.stderr.write(f"assistant {self.base}: the model has no chat template; "
                             "sending raw prompts to /v1/completions\n")
    out = self._post("/v1/completions", dict(model=self.model, prompt=prompt, **self.sampling))
    return _text(out, "completions", self.base)

  def complete_one(self, prompt: str, on_error: Callable[[str], None] | None = None) -> str:
    try:
      return self._ask(prompt)
    except _BadRequest as e:
      with self._lock:
        self.refused += 1
        first = self.refused == 1
      if first:
        sys.stderr.write(f"assistant {self.base} refused a request ({e}); its "
                         "answer is empty (the caller rejects it)\n")
      if on_error:
        on_error(str(e))
      return ""

  def complete(self, prompts: Sequence[str],
               on_error: Callable[[str], None] | None = None) -> list[str]:
    """Texts for prompts, in order; a batch runs `concurrency` requests at a time."""
    if len(prompts) <= 1:
      return [self.complete_one(p, on_error) for p in prompts]
    with self._lock:
      if self._pool is None:
        self._pool = cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix="assistant")
    return list(self._pool.map(lambda p: self.complete_one(p, on_error), prompts))

  def close(self) -> None:
    self.stopped.set()
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)


def short_error(e: Exception) -> str:
  text = " ".join(str(e).split())
  return text if len(text) < 300 else text[:300] + "..."


def _server_message(r) -> str:
  try:
    body = r.json()
    msg = body.get("error", body) if isinstance(body, dict) else body
    msg = msg.get("message", msg) if isinstance(msg, dict) else msg
    return short_error(Exception(str(msg)))
  except ValueError:
    return short_error(Exception(r.text or r.reason or ""))


def _text(out: dict, kind: str, base: str) -> str:
  try:
    choice = out["choices"][0]
    return (choice["message"]["content"] if kind == "chat" else choice["text"]) or ""
  except (KeyError, IndexError, TypeError):
    raise AssistantError(f"{base}: unexpected {kind} response {str(out)[:200]!r}") from None
