"""Client of one or more vLLM OpenAI-compatible servers, with weight sync.

Prompts go out as token ids through `/v1/completions` (one request per
prompt carrying `n`), spread round-robin over the servers by a bounded
thread pool. Failed requests are retried by `rlvr.sampling.http`'s policy (which
also supplies the API key, default `$VLLM_API_KEY`); a server that keeps
failing is reported by URL, and one whose engine has died (HTTP 5xx, /health
failing) is reported as such.

Weight sync (`weight_sync`) is one of two paths, both always untied: vLLM's
in-place reload refreshes a tied model's embedding but not its LM head, so the
servers must serve an untied copy of the policy from the start
(`serve_policy_copy` writes one).

- "disk": the params go as an HF checkpoint into `sync_dir` (which the servers
  must be able to read), then on every server `/collective_rpc`
  `reload_weights`, `/reset_prefix_cache` (stale prefix KV otherwise) and
  `/update_weight_version`.
- "transfer": vLLM's weight-transfer API with the `transfer_backend` the servers
  were started with (`rlvr.sampling.transfer`); nothing touches the disk.

With `lora_adapters` (servers started with `ServerOptions.lora_rank`), a policy held as
LoRA adapters (`rlvr.model.lora.Adapted`) goes out as a PEFT adapter instead, loaded on
the servers' start-up base (`rlvr.sampling.adapters`); any other update takes one of the
paths above with the adapters merged in (`lora.as_params`).

A lock keeps `generate` and `update_weights` apart, so one `generate` call never
mixes weight versions.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
from typing import Any, Callable, Sequence

import jax
import requests

from rlvr.model import hf_io, lora
from rlvr.model.config import ModelConfig
from rlvr.sampling import adapters, http, transfer, weights
from rlvr.sampling.config import WEIGHT_SYNCS, SamplerConfig
from rlvr.sampling.http import check_retry_settings
from rlvr.sampling.responses import (  # noqa: F401  (the client's errors, importable here)
  EngineDeadError,
  MalformedResponseError,
  RequestAbortedError,
  SamplerError,
  parse_completion_response,
)
from rlvr.sampling.types import Completion, SamplingParams

_DEFAULTS = SamplerConfig()  # the client's defaults are the config section's


def serve_policy_copy(
  path: str, model_config: ModelConfig, params, tokenizer=None, dtype=None
) -> str:
  """Writes the checkpoint a vLLM server for RL should start from (untied)."""
  return hf_io.save_hf(
    path, model_config, params, tokenizer=tokenizer, dtype=dtype, untie_embeddings=True
  )


class VLLMSampler:
  """Sampler backed by vLLM servers at `urls` (e.g. "http://127.0.0.1:8000")."""

  # HTTP calls to other processes: a buffer can be built in a thread during the update
  overlaps_update = True

  def __init__(
    self,
    urls: str | Sequence[str],
    *,
    model_config: ModelConfig,
    eos_token_id: int,
    pad_token_id: int = 0,
    sync_dir: str | None = None,
    model_name: str = _DEFAULTS.model,
    api_key: str | None = None,
    max_concurrency: int = _DEFAULTS.max_concurrency,
    request_timeout_s: float = _DEFAULTS.request_timeout_s,
    retries: int = _DEFAULTS.retries,
    backoff_s: float = _DEFAULTS.backoff_s,
    sync_dtype: Any = None,
    keep_versions: int = 2,
    weight_sync: str = _DEFAULTS.weight_sync,
    transfer_backend: str = _DEFAULTS.transfer_backend,
    transfer_host: str = _DEFAULTS.transfer_host,
    transfer_bucket_mb: int = _DEFAULTS.transfer_bucket_mb,
    lora_adapters: bool = False,
  ):
    self.urls = [urls] if isinstance(urls, str) else list(urls)
    if not self.urls:
      raise ValueError("urls: need at least one vLLM server URL")
    check_retry_settings(request_timeout_s, retries, backoff_s)
    if weight_sync not in WEIGHT_SYNCS:
      raise ValueError(f"weight_sync: unknown {weight_sync!r}; expected disk|transfer")
    self.weight_sync = weight_sync
    self.model_config = model_config
    self.eos_token_id = eos_token_id
    self.pad_token_id = pad_token_id
    self.sync_dir = sync_dir
    self.model_name = model_name
    self.sync_dtype = sync_dtype
    self.keep_versions = keep_versions
    self.version: int | None = None
    # Mixture of experts: (sparse layers, experts per token), to read routed experts
    self._routing = None
    if model_config.is_moe:
      sparse = [i for i in range(model_config.num_layers) if model_config.sparse(i)]
      self._routing = (sparse, model_config.num_experts_per_tok)
    self._served: Any = None  # the params of `version` (transfer: to push again after a restart)
    self._http = http.Client(
      api_key=api_key, timeout_s=request_timeout_s, retries=retries, backoff_s=backoff_s
    )
    self._lock = threading.Lock()
    self._adapters = None  # serves `lora.Adapted` updates as adapters
    if lora_adapters:
      if sync_dir is None:
        raise ValueError("sync_dir: lora_adapters needs a directory the servers can read")
      self._adapters = adapters.AdapterSync(self._http, model_config, model_name, sync_dir)
    self._pool = concurrent.futures.ThreadPoolExecutor(
      max_concurrency, thread_name_prefix="vllm-client"
    )
    self._links: list[transfer.ServerLink] = []
    if weight_sync == "transfer":
      self._links = [
        transfer.ServerLink(
          url,
          transfer.make_transport(
            transfer_backend, host=transfer_host or transfer.local_address(url)
          ),
          api_key=api_key,
          timeout_s=request_timeout_s,
          bucket_bytes=transfer_bucket_mb << 20,
          retries=retries,
        )
        for url in self.urls
      ]

  # ------------------------------------------------------------------- HTTP
  def _session(self) -> requests.Session:
    return self._http.session()

  def health(self, url: str) -> tuple[bool, str]:
    try:
      r = self._http.get(url + "/health", timeout=5)
      return r.status_code == 200, f"/health: HTTP {r.status_code}"
    except requests.RequestException as e:
      return False, f"/health: {type(e).__name__}"

  def _post(
    self,
    url: str,
    route: str,
    payload: dict,
    timeout: float | None = None,
    parse: Callable[[Any], Any] | None = None,
  ) -> Any:
    """POST with the HTTP core's retries; returns the parsed JSON (None for an empty body),
    or what `parse` makes of it. A request the server aborts (`parse` raising
    RequestAbortedError) is retried like a refused one, within the same budget."""
    where = f"vLLM server {url}{route}"
    try:
      return self._http.post(url + route, payload, timeout=timeout, parse=parse)
    except http.Refused as e:  # our request is wrong: retrying will not help
      raise SamplerError(f"{where}: HTTP {e.status}: {e.text[:300]}") from None
    except http.NotJSON as e:
      raise MalformedResponseError(f"{where}: response is not JSON: {e.text[:200]!r}") from None
    except http.RetriesExhausted as e:
      raise self._gave_up(url, where, e.failures) from None

  def _gave_up(self, url: str, where: str, failures: list[http.Failure]) -> SamplerError:
    """The error for a spent retry budget, naming the server and what each try met."""
    _, why = self.health(url)
    tries = f"{len(failures)} attempts ({', '.join(f.label for f in failures)}; {why})"
    if any(f.status is not None and f.status >= 500 for f in failures):
      # vLLM answers 5xx once its engine has died (and may then exit altogether).
      return EngineDeadError(f"{where}: engine dead or failing after {tries}; restart the server")
    if all(f.kind == "aborted" for f in failures):
      return RequestAbortedError(f"{where}: request aborted by the server in all {tries}")
    busy = any(f.kind == "status" for f in failures)  # 408/429
    return SamplerError(f"{where}: {'busy' if busy else 'unreachable'} after {tries}")

  # ---------------------------------------------------------------- sampling
  def _request(
    self, i: int, prompt: Sequence[int], sp: SamplingParams, version: int | None
  ) -> list[Completion]:
    url = self.urls[i % len(self.urls)]
    payload = {
      "model": self._adapters.served_name if self._adapters else self.model_name,
      "prompt": [int(t) for t in prompt],
      "n": sp.n,
      "temperature": sp.temperature,
      "top_p": sp.top_p,
      "top_k": sp.top_k or -1,
      "repetition_penalty": sp.repetition_penalty,
      "max_tokens": sp.max_tokens,
      "return_token_ids": True,
      "skip_special_tokens": True,
      "stop_token_ids": list(sp.stop_token_ids),
      "ignore_eos": sp.ignore_eos,
    }
    if sp.stop:
      payload.update(stop=list(sp.stop), include_stop_str_in_output=True)
    if sp.seed is not None:
      payload["seed"] = sp.seed + i
    if sp.logprobs:
      payload["logprobs"] = 0

    routing = None if self._routing is None else (len(prompt), *self._routing)

    def parse(body):
      try:
        return parse_completion_response(
          body, sp.n, sp.logprobs, set(sp.stop_token_ids), version, routing
        )
      except MalformedResponseError as e:
        raise MalformedResponseError(f"vLLM server {url}: prompt {i}: {e}") from None

    return self._post(url, "/v1/completions", payload, parse=parse)

  def generate(
    self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[list[Completion]]:
    self._check_served()
    with self._lock:  # no weight update can land inside this call
      futures = [
        self._pool.submit(self._request, i, p, params, self.version)
        for i, p in enumerate(prompt_token_ids)
      ]
      try:
        return [f.result() for f in futures]
      except BaseException:
        for f in futures:
          f.cancel()
        raise

  # ------------------------------------------------------------- weight sync
  def update_weights(self, weights: Any, version: int) -> None:
    """Makes every server serve `weights` (params or `lora.Adapted`) as `version`."""
    ad = self._adapters
    if ad is not None and isinstance(weights, lora.Adapted):
      try:
        held = f"version {self.version}"
        ad.write(weights, version, held, self.sync_dtype)
        with self._lock:
          ad.load_all(self.urls, version, held, lambda u: self._name_version(u, version))
          self.version, old = version, ad.serve(version)
      except adapters.PushError as e:
        raise SamplerError(str(e)) from None
    else:
      sync = {"disk": self._sync_disk, "transfer": self._sync_transfer}[self.weight_sync]
      old = sync(lora.as_params(weights), version)
    if ad is not None:
      ad.retire(self.urls, old)

  def _serve_base(self) -> int | None:
    return None if self._adapters is None else self._adapters.serve(None)

  def _check_served(self) -> None:
    """A server restarted since the last push serves its start-up checkpoint (it reports
    version "default"): it gets the current weights again before sampling, or, when they
    are no longer held here, the call stops with an error naming it."""
    if self.version is None:
      return
    for k, url in enumerate(self.urls):
      try:
        got = self._http.get(url + "/weight_info", timeout=10).json().get("weight_version")
      except (requests.RequestException, ValueError, AttributeError):
        continue  # unreachable or odd: the sampling request itself retries and reports it
      if got == "default":
        print(f"vLLM server {url} restarted: pushing version {self.version} again", flush=True)
        self._resync(k, url)

  def _resync(self, k: int, url: str) -> None:
    with self._lock:
      if self._adapters is not None and self._adapters.current is not None:
        try:  # the current adapter again, on the start-up base
          named = lambda u: self._name_version(u, self.version)
          self._adapters.load_all([url], self.version, "its start-up checkpoint", named)
        except adapters.PushError as e:
          raise SamplerError(f"{e} (the server restarted)") from None
        return
      if self.weight_sync == "disk":
        path = os.path.join(os.path.abspath(self.sync_dir), f"v{self.version}")
        self._reload(url, path, self.version)
        return
      params = self._served
      if params is None or any(
        getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(params)
      ):
        raise SamplerError(
          f"vLLM server {url} restarted and serves its start-up checkpoint; the weights of "
          f"version {self.version} are no longer held here (an update has replaced them): "
          "rerun the command to resume from the last checkpoint"
        )
      link = self._links[k]
      link.ready = False  # the restarted server has no transfer engine open yet
      try:
        link.push(
          lambda: link.transport.tensors(self.model_config, params, self.sync_dtype), self.version
        )
      except weights.TransferError as e:
        raise SamplerError(str(e)) from None

  def _sync_transfer(self, params: Any, version: int) -> int | None:
    with self._lock:
      for link in self._links:
        try:
          link.push(
            lambda link=link: link.transport.tensors(self.model_config, params, self.sync_dtype),
            version,
          )
        except weights.TransferError as e:
          raise SamplerError(str(e)) from None
      self.version, self._served = version, params
      return self._serve_base()

  def _sync_disk(self, params: Any, version: int) -> int | None:
    """Writes `params` to `sync_dir/v{version}` and reloads every server from it; returns
    the version of the adapter requests named until now (None: the base)."""
    if self.sync_dir is None:
      raise ValueError(
        "sync_dir: VLLMSampler needs a directory the servers can read to push weights"
      )
    path = os.path.join(os.path.abspath(self.sync_dir), f"v{version}")
    hf_io.save_hf(path, self.model_config, params, dtype=self.sync_dtype, untie_embeddings=True)
    with self._lock:
      for url in self.urls:
        self._reload(url, path, version)
      self.version, old = version, self._serve_base()
    if jax.process_index() == 0:  # multi-host: the writer of sync_dir prunes it
      self._prune(version)
    return old

  def _reload(self, url: str, path: str, version: int) -> None:
    """One server reloads the checkpoint at `path` and takes `version` as its name."""
    self._post(
      url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}
    )
    self._post(url, "/reset_prefix_cache", {})
    self._name_version(url, version)

  def _name_version(self, url: str, version: int) -> None:
    """The server reports `version` from now on (a restart shows as "default")."""
    try:
      self._post(url, "/update_weight_version", {"new_version": str(version)})
    except SamplerError:
      pass  # older servers lack the route; the version is still tracked here

  def _prune(self, current: int) -> None:
    root = os.path.abspath(self.sync_dir)
    olds = sorted(
      (
        int(d[1:])
        for d in os.listdir(root)
        if d.startswith("v") and d[1:].isdigit() and int(d[1:]) != current
      )
    )
    for v in olds[: max(0, len(olds) - self.keep_versions + 1)]:
      shutil.rmtree(os.path.join(root, f"v{v}"), ignore_errors=True)

  def close(self) -> None:
    for link in self._links:
      link.close()
    self._pool.shutdown(wait=False, cancel_futures=True)
