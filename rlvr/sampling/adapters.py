"""A LoRA policy served as vLLM adapters: the files and the server calls of one push.

A server started with LoRA (`ServerOptions.lora_rank`) keeps its start-up weights as the
base; each policy version goes out as a PEFT adapter directory `sync_dir/adapter_v{N}`
(`rlvr.model.peft_io`, a few MB where the full checkpoint is the whole model), loaded
under a name of its own (`{model}-v{N}`) with `/v1/load_lora_adapter`. Requests name the
adapter as their `model`, so vLLM's prefix cache (keyed by adapter name and path) never
reuses KV computed under an older version. The previous version's adapter is unloaded
once every server serves the new one.

vLLM answers these routes with plain text (not JSON), HTTP 500 when the adapter does not
load (its message says why), 404 for an unknown name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Callable, Sequence

import jax
import requests

from rlvr.model import peft_io
from rlvr.model.config import ModelConfig
from rlvr.model.lora import Adapted
from rlvr.sampling import http

PREFIX = "adapter_v"
_TRANSIENT = (408, 429, 502, 503, 504)  # worth another try; 500 is the adapter's own failure


class PushError(RuntimeError):
  """A push or reload that failed (names the server and the version)."""


class CallError(RuntimeError):
  """A load or unload a server refused or never answered (the server's reason)."""

  def __init__(self, message: str, status: int | None = None):
    super().__init__(message)
    self.status = status


def adapter_name(model_name: str, version: int) -> str:
  """The name requests give as `model` to sample from `version`'s adapter."""
  return f"{model_name}-v{version}"


class AdapterSync:
  """Writes adapters under `sync_dir` and loads / unloads them on servers; `current` is
  the version whose adapter requests name (None: the base, `model_name`)."""

  def __init__(self, client: http.Client, model_config: ModelConfig, model_name: str, sync_dir):
    self.client = client
    self.model_config = model_config
    self.model_name = model_name
    self.root = os.path.abspath(sync_dir)
    self.current: int | None = None

  @property
  def served_name(self) -> str:
    return self.model_name if self.current is None else self.name(self.current)

  def serve(self, version: int | None) -> int | None:
    """Requests name `version`'s adapter from now on (None: the base); returns the
    version they named until now."""
    old, self.current = self.current, version
    return old

  def path(self, version: int) -> str:
    return os.path.join(self.root, f"{PREFIX}{version}")

  def name(self, version: int) -> str:
    return adapter_name(self.model_name, version)

  def write(self, weights: Adapted, version: int, held: str, dtype: Any = None) -> str:
    """`weights.adapters` as a PEFT directory for `version`; PushError when they do not fit
    the model (the servers still serve `held`, e.g. "version 3")."""
    try:
      return peft_io.save_adapter(
        self.path(version), self.model_config, weights.cfg, weights.adapters, dtype=dtype
      )
    except peft_io.AdapterError as e:
      raise PushError(
        f"LoRA adapter of version {version}: {e}; the servers still serve {held}"
      ) from None

  def load_all(
    self, urls: Sequence[str], version: int, held: str, loaded: Callable[[str], None]
  ) -> None:
    """Loads `version`'s adapter on every server (`loaded(url)` after each), or raises
    PushError naming the first that failed, once the others have unloaded it again."""
    for k, url in enumerate(urls):
      try:
        self.load(url, version)
      except CallError as e:
        for done in urls[:k]:
          with contextlib.suppress(CallError):
            self.unload(done, version)
        raise PushError(
          f"vLLM server {url}: loading the LoRA adapter of version {version} "
          f"({self.path(version)}) failed: {e}; it still serves {held}"
        ) from None
      loaded(url)

  def retire(self, urls: Sequence[str], old: int | None) -> None:
    """After a switch away from version `old`'s adapter: unloads it (a failure only warns,
    no request names it any more) and deletes the directories of all but the current."""
    for url in urls if old is not None and old != self.current else ():
      try:
        self.unload(url, old)
      except CallError as e:
        print(f"vLLM server {url}: unloading the adapter of version {old} failed: {e}")
    if self.current is not None:
      self.prune(self.current)

  def _call(self, url: str, route: str, payload: dict) -> None:
    """POST whose success answer is text; raises CallError with the server's reason. A
    failed connection or a busy server (408/429/502-504) is tried again by the client's
    retry policy; a refusal (4xx, or 500: the engine could not load it) is final."""
    failures = []
    for attempt in range(self.client.retries + 1):
      if attempt:
        self.client.stopped.wait(self.client.delay(attempt))
      try:
        r = self.client.session().post(
          url + route, json=payload, headers=self.client.headers, timeout=self.client.timeout_s
        )
      except requests.RequestException as e:
        failures.append(f"{type(e).__name__}: {http.short_error(e)}")
        continue
      if r.status_code == 200:
        return
      why = f"HTTP {r.status_code}: {http.server_message(r)}"
      if r.status_code not in _TRANSIENT:
        raise CallError(why, r.status_code)
      failures.append(why)
    raise CallError(f"{len(failures)} tries: {'; '.join(failures)}")

  def load(self, url: str, version: int) -> None:
    """Loads `version`'s adapter on the server at `url` (CallError on failure). In place:
    a server that outlived an earlier run may hold this name already."""
    payload = {"lora_name": self.name(version), "lora_path": self.path(version)}
    self._call(url, "/v1/load_lora_adapter", dict(payload, load_inplace=True))

  def unload(self, url: str, version: int) -> None:
    """Unloads `version`'s adapter; one the server does not hold (a restart) is no error."""
    try:
      self._call(url, "/v1/unload_lora_adapter", {"lora_name": self.name(version)})
    except CallError as e:
      if e.status != 404:
        raise

  def prune(self, current: int) -> None:
    """Deletes every adapter directory but `current`'s (multi-host: the writer does)."""
    if jax.process_index() != 0 or not os.path.isdir(self.root):
      return
    for d in os.listdir(self.root):
      if d.startswith(PREFIX) and d != f"{PREFIX}{current}":
        shutil.rmtree(os.path.join(self.root, d), ignore_errors=True)
