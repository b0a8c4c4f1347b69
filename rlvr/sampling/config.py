"""The `sampler` section of a run: which sampler, and how the vLLM client talks to servers."""

from __future__ import annotations

import dataclasses

from rlvr.sampling.http import check_retry_settings

KINDS = ("jax", "vllm")
WEIGHT_SYNCS = ("disk", "transfer")
TRANSFER_BACKENDS = ("rlvr_tcp", "nccl")  # rlvr.sampling.transfer.TRANSPORTS
SYNC_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  kind: str = "jax"  # "jax" (in-process) or "vllm" (servers at urls)
  urls: tuple[str, ...] = ()  # vLLM servers, each started (launch/serve_vllm.py) from an
  # untied copy of the policy; "{process}" = process index
  model: str = "policy"  # the servers' model name (serve_vllm --served_model_name)
  sync_dtype: str = "bfloat16"  # dtype of the weights pushed to vLLM
  weight_sync: str = "disk"  # "disk": safetensors + reload_weights; "transfer": vLLM's
  # weight-transfer API (servers started with --weight_transfer, docs/weight_transfer.md)
  transfer_backend: str = "rlvr_tcp"  # "rlvr_tcp" (CPU, the repo's vLLM plugin) | "nccl" (GPU)
  transfer_host: str = ""  # this process's address as the servers reach it;
  # "" = the local address on the route to each server (127.0.0.1 for a local one)
  transfer_bucket_mb: int = 512  # tensors per /update_weights call, in MiB
  max_concurrency: int = 64  # in-flight requests per process
  request_timeout_s: float = 1800.0  # one try of a request (n samples of one prompt)
  retries: int = 3  # more tries of a timed-out/refused/5xx/aborted request
  backoff_s: float = 1.0  # wait before the first retry, doubling after each
  api_key: str = ""  # servers bound beyond loopback (serve_vllm --api_key);
  # "" = the VLLM_API_KEY environment variable
  lora_adapters: bool = False  # with rl.learner.lora: push each version as a LoRA adapter
  # (servers started with LoRA on: serve_vllm --lora_rank), not as merged full weights
  local_servers: int = 0  # kind=vllm without urls: the run starts this many vLLM servers on
  # its own host (the vLLM environment, `bash scripts/setup.sh --vllm`), each ending with it
  local_device: str = "cpu"  # their vLLM build: "cpu" or "gpu"

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind: unknown {self.kind!r}; expected jax|vllm")
    if self.local_servers < 0 or self.local_device not in ("cpu", "gpu"):
      raise ValueError(
        f"local_servers / local_device: must be >= 0 / cpu|gpu, got "
        f"{self.local_servers} / {self.local_device!r}"
      )
    if self.kind == "vllm" and not self.urls and not self.local_servers:
      raise ValueError(
        "urls: the vllm sampler needs at least one server URL, or local_servers=1 to "
        "start one for the run"
      )
    if self.urls and self.local_servers:
      raise ValueError("urls / local_servers: give server URLs or local servers, not both")
    if self.sync_dtype not in SYNC_DTYPES:
      raise ValueError(f"sync_dtype: unknown {self.sync_dtype!r}; expected one of {SYNC_DTYPES}")
    if self.weight_sync not in WEIGHT_SYNCS:
      raise ValueError(f"weight_sync: unknown {self.weight_sync!r}; expected disk|transfer")
    if self.transfer_backend not in TRANSFER_BACKENDS:
      raise ValueError(
        f"transfer_backend: unknown {self.transfer_backend!r}; expected one of {TRANSFER_BACKENDS}"
      )
    if self.transfer_bucket_mb < 1:
      raise ValueError(f"transfer_bucket_mb: must be >= 1, got {self.transfer_bucket_mb}")
    if self.max_concurrency < 1:
      raise ValueError(f"max_concurrency: must be >= 1, got {self.max_concurrency}")
    check_retry_settings(self.request_timeout_s, self.retries, self.backoff_s)
