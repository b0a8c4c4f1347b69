"""The sampler a run's settings describe, and the vLLM servers it starts for itself.

    urls = stack.enter_context(build.local_servers(cfg, folder, options, model_cfg, weights, tok))
    sampler = build.make_sampler(cfg, model_cfg, weights, tok, mesh=mesh, pad_id=pad_id,
                                 sync_dir=..., urls=urls)

`cfg` is the run's `sampler` section (`SamplerConfig`); `server_options` turns the lengths a
run samples into the servers' options. `launch.train` (through the Trainer),
`launch.evaluate` and `launch.serve_vllm` use these three and nothing else.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp

from rlvr.model import lora as lora_lib
from rlvr.sampling.config import SamplerConfig
from rlvr.sampling.jax_sampler import JaxSampler


def server_options(cfg: SamplerConfig, longest: int, positions: int, lora_rank: int = 0, **given):
  """The vLLM server options for a run whose longest sequence (prompt + response, evaluation
  or episode) is `longest` tokens: the model name, max_model_len (rounded up to 256, capped at
  the model's `positions`), the weight-transfer backend, and LoRA's rank when adapters are
  pushed (`sampler.lora_adapters`); `given`: the options that are not settings of the run
  (device, host, port, dtype, ...)."""
  from rlvr.sampling.vllm_server import ServerOptions

  return ServerOptions(
    served_model_name=cfg.model,
    max_model_len=min(-(-longest // 256) * 256, positions),
    weight_transfer=cfg.transfer_backend if cfg.weight_sync == "transfer" else None,
    lora_rank=lora_rank if cfg.lora_adapters else 0,
    **given,
  )


@contextlib.contextmanager
def local_servers(cfg: SamplerConfig, folder: str, options, model_cfg, weights, tokenizer):
  """`sampler.local_servers` vLLM servers on this host, each serving an untied copy of
  `weights` (a tied LM head does not follow in-place reloads) written under `folder`, their
  logs beside it, stopped when the block ends (tethered: also when the run dies); yields their
  URLs, () when the run starts none."""
  if cfg.kind != "vllm" or not cfg.local_servers:
    yield ()
    return
  from rlvr.sampling.vllm_sampler import serve_policy_copy
  from rlvr.sampling.vllm_server import start_server

  base, _ = lora_lib.unmerged(weights)  # LoRA: the servers take the base, adapters by push
  serve_policy_copy(folder, model_cfg, base, tokenizer=tokenizer)
  servers = []
  try:
    for i in range(cfg.local_servers):
      print(f"sampler: starting local vLLM server {i + 1}/{cfg.local_servers}", flush=True)
      log = os.path.join(os.path.dirname(folder), f"vllm-{jax.process_index()}-{i}.log")
      servers.append(start_server(folder, options, log_path=log))
      print(f"sampler: vLLM up at {servers[-1].url} ({servers[-1].startup_s:.0f} s)", flush=True)
    yield tuple(s.url for s in servers)
  finally:
    for server in servers:
      server.stop()


def make_sampler(
  cfg: SamplerConfig,
  model_cfg,
  params,
  tokenizer,
  *,
  mesh=None,
  pad_id: int = 0,
  sync_dir: str | None = None,
  version: int = 0,
  urls=(),
  push: bool = True,
):
  """The sampler `cfg` names, serving `params` as `version` (the RL step they follow).
  jax: in process, on `mesh`; vllm: `urls` (the run's own servers, `local_servers`), else
  `cfg.urls`, with weights pushed through `sync_dir` (disk) or vLLM's transfer API (push:
  False, the servers sample the weights they serve); over several processes each samples its
  slice of every rollout."""
  if cfg.kind == "jax":
    sampler = JaxSampler(model_cfg, params, tokenizer, mesh=mesh)
    sampler.version = version
    return sampler
  if cfg.kind != "vllm":
    raise ValueError(f"sampler.kind: unknown {cfg.kind!r}; expected jax|vllm")
  from rlvr.sampling.split import ProcessSplitSampler
  from rlvr.sampling.vllm_sampler import VLLMSampler

  if not cfg.urls and not urls:
    raise ValueError("sampler.urls: vllm sampler needs at least one server URL")
  # Multi-host: each process talks to its own servers ("{process}" in a URL is its index;
  # "localhost" is each host's own).
  urls = list(urls) or [u.format(process=jax.process_index()) for u in cfg.urls]
  client = VLLMSampler(
    urls,
    model_config=model_cfg,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=pad_id,
    sync_dir=sync_dir,
    model_name=cfg.model,
    max_concurrency=cfg.max_concurrency,
    sync_dtype=jnp.dtype(cfg.sync_dtype),
    request_timeout_s=cfg.request_timeout_s,
    retries=cfg.retries,
    backoff_s=cfg.backoff_s,
    lora_adapters=cfg.lora_adapters,
    api_key=cfg.api_key or None,  # default: $VLLM_API_KEY
    weight_sync=cfg.weight_sync,  # "disk" or "transfer" (vLLM's weight-transfer API)
    transfer_backend=cfg.transfer_backend,
    transfer_host=cfg.transfer_host,
    transfer_bucket_mb=cfg.transfer_bucket_mb,
  )
  client = ProcessSplitSampler(client) if jax.process_count() > 1 else client
  if push:
    client.update_weights(params, version=version)
  return client
