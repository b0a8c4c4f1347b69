"""Start and stop a vLLM OpenAI-compatible server as a child process.

vLLM lives in its own virtual environment (its torch and transformers pins
clash with ours), so the server runs under that environment's Python, found
from `$RLVR_VLLM_PYTHON` or `<repo>/.venvs/vllm/bin/python`. A server ends with the process
that started it (`rlvr.common.tether`), unless started standalone (`launch.serve_vllm`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from rlvr.common import tether
from rlvr.sampling.http import auth_headers

# The values vLLM 0.32 accepts for --max-lora-rank.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ServerStartError(RuntimeError):
  """The vLLM server exited or never became healthy; the message holds its log tail."""


def vllm_python() -> str:
  """Python executable of the vLLM environment."""
  return os.environ.get("RLVR_VLLM_PYTHON", os.path.join(_REPO, ".venvs", "vllm", "bin", "python"))


def free_port(host: str = "127.0.0.1") -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class ServerOptions:
  """Flags of one vLLM server. Defaults suit the CPU build on a small machine.

  max_num_batched_tokens must cover the largest total prompt tokens of one
  batch: the CPU engine dies on seeded requests whose prefill gets chunked.
  """

  host: str = "127.0.0.1"
  port: int | None = None  # None: a free port
  served_model_name: str = "policy"
  dtype: str = "float32"
  max_model_len: int = 2048
  max_num_batched_tokens: int = 16384
  max_num_seqs: int = 256
  device: str = "cpu"  # "cpu" or "gpu"
  kv_cache_gb: int = 1  # CPU KV cache (VLLM_CPU_KVCACHE_SPACE)
  gpu_memory_utilization: float = 0.5
  api_key: str | None = None
  dev_mode: bool = True  # /collective_rpc etc. for weight reloads
  weight_transfer: str | None = None  # a weight-transfer backend ("rlvr_tcp", "nccl")
  # Mixture of experts: return the experts each token was routed to (routing replay). vLLM
  # 0.32 captures them in its V2 model runner only, which needs Triton: GPU servers.
  routed_experts: bool = False
  # LoRA adapters of at most this rank, loaded at run time (`VLLMSampler(lora_adapters=True)`);
  # 0: none. Two at a time: the version being replaced and the new one.
  lora_rank: int = 0
  extra_args: tuple[str, ...] = ()

  def __post_init__(self):
    if self.routed_experts and self.device == "cpu":
      raise ValueError(
        "routed_experts: needs a GPU server (vLLM 0.32 captures routed experts in its V2 "
        "model runner, which needs Triton; the CPU build has none)"
      )
    if not isinstance(self.lora_rank, int) or not 0 <= self.lora_rank <= MAX_LORA_RANKS[-1]:
      raise ValueError(
        f"lora_rank: must be an int in [0, {MAX_LORA_RANKS[-1]}] (0 = no adapters), "
        f"got {self.lora_rank!r}"
      )

  @property
  def max_lora_rank(self) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds `lora_rank`."""
    return next(r for r in MAX_LORA_RANKS if r >= self.lora_rank)

  def command(self, model_dir: str, port: int, python: str) -> list[str]:
    cmd = [
      python,
      "-m",
      "vllm.entrypoints.openai.api_server",
      "--model",
      model_dir,
      "--host",
      self.host,
      "--port",
      str(port),
      "--served-model-name",
      self.served_model_name,
      "--dtype",
      self.dtype,
      "--max-model-len",
      str(self.max_model_len),
      "--max-num-batched-tokens",
      str(self.max_num_batched_tokens),
      "--max-num-seqs",
      str(self.max_num_seqs),
      "--disable-log-stats",
    ]
    if self.device == "cpu":
      cmd.append("--enforce-eager")
    else:
      cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
    if self.api_key:
      cmd += ["--api-key", self.api_key]
    if self.weight_transfer:
      cmd += ["--weight-transfer-config", json.dumps({"backend": self.weight_transfer})]
    if self.routed_experts:
      cmd.append("--enable-return-routed-experts")  # needs prefix caching (vLLM's default)
    if self.lora_rank:
      cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", "2"]
    return cmd + list(self.extra_args)

  def env(self) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if self.device == "cpu":
      env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gb)
      # vLLM keeps a core per worker off its threads by default (1 of 2 cores here: 45 vs 82
      # tokens/s on SmolLM2-135M). The trainer waits while its rollouts are sampled; every
      # core samples unless the caller's environment says otherwise.
      env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if self.dev_mode:
      env["VLLM_SERVER_DEV_MODE"] = "1"
    if self.routed_experts:
      env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if self.lora_rank:
      env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter and unload
    return env


@dataclasses.dataclass
class VLLMServer:
  """A running server; `stop()` (or leaving the `with` block) ends it."""

  url: str
  model_dir: str
  options: ServerOptions
  process: subprocess.Popen
  log_path: str
  startup_s: float

  def log_tail(self, n: int = 40) -> str:
    try:
      with open(self.log_path, errors="replace") as f:
        return "".join(f.readlines()[-n:])
    except OSError:
      return ""

  def alive(self) -> bool:
    return self.process.poll() is None

  def stop(self, timeout: float = 30.0) -> None:
    """Ends the server's process group (the server, its engine, its tether), SIGKILL for what
    remains after `timeout`; also when the server or its tether has ended already."""
    try:
      tether.stop(self.process, timeout)
    finally:
      for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
        if stream is not None:
          stream.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.stop()


def _healthy(url: str, api_key: str | None) -> bool:
  req = urllib.request.Request(url + "/health", headers=auth_headers(api_key))
  try:
    with urllib.request.urlopen(req, timeout=2) as r:
      return r.status == 200
  except (urllib.error.URLError, OSError):
    return False


def start_server(
  model_dir: str,
  options: ServerOptions = ServerOptions(),
  *,
  python: str | None = None,
  log_path: str | None = None,
  timeout_s: float = 600.0,
  die_with_parent: bool = True,
) -> VLLMServer:
  """Starts `vllm.entrypoints.openai.api_server` on `model_dir`; waits for /health.

  The server leads its own session. With `die_with_parent` it runs under a tether
  (`rlvr.common.tether`): it and every process under it (vLLM's engine) end within seconds
  of this process's end, kill -9 included. False suits a standalone server (`launch.serve_vllm`), which outlives whoever launched it.
  """
  python = python or vllm_python()
  if not os.path.exists(python):
    raise ServerStartError(
      f"vLLM Python {python} not found: create the vLLM environment (see README, "
      "`bash scripts/setup.sh --vllm`) or set RLVR_VLLM_PYTHON"
    )
  if options.host not in ("127.0.0.1", "localhost", "::1"):
    print(
      f"WARNING: vLLM server binds {options.host}; its dev-mode routes run arbitrary "
      "worker calls. Set an api_key or keep it on loopback.",
      file=sys.stderr,
    )
  port = options.port or free_port(options.host)
  log_path = log_path or os.path.join(os.path.abspath(model_dir), f"vllm-{port}.log")
  log = open(log_path, "w")
  t0 = time.time()
  cmd = options.command(os.path.abspath(model_dir), port, python)
  streams = dict(env=options.env(), stdout=log, stderr=subprocess.STDOUT)
  if die_with_parent:
    proc = tether.start(cmd, **streams)
  else:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, **streams)
  log.close()
  server = VLLMServer(f"http://{options.host}:{port}", model_dir, options, proc, log_path, 0.0)
  while not _healthy(server.url, options.api_key):
    if proc.poll() is not None:
      raise ServerStartError(
        f"vLLM server exited with code {proc.returncode} while starting; "
        f"log {log_path}:\n{server.log_tail()}"
      )
    if time.time() - t0 > timeout_s:
      server.stop()
      raise ServerStartError(
        f"vLLM server not healthy after {timeout_s:.0f}s; log {log_path}:\n{server.log_tail()}"
      )
    time.sleep(0.5)
  server.startup_s = time.time() - t0
  return server
