r"""Starts a vLLM server for a model directory with the flags the rlvr client needs.

  python -m launch.serve_vllm --model=workdir/tiny_model [--port=8000] [--device=gpu]
      [--weight_transfer=rlvr_tcp|nccl] [--routed_experts]
  python -m launch.serve_vllm --model=<HF dir> --config=<the run's config> [--config.x=...]

With --config, the options the run's settings decide come from them, as a run's own servers
take them (`trainer.server_options`): the model name (sampler.model), max_model_len (the
longest prompt + response, evaluation or episode), the weight-transfer backend
(sampler.weight_sync / transfer_backend) and the LoRA rank (rl.learner.lora.rank when
sampler.lora_adapters); passing one of those flags as well is an error.

Dev-mode routes (weight reloads) are on; the server binds 127.0.0.1 unless
--host says otherwise (then set --api_key). Prints the URL once healthy and
stops the server cleanly on SIGINT / SIGTERM. The server is standalone: it is not tied to
the life of this process or its parent (a run's own servers are, `start_server`).
"""

import json
import os
import signal
import threading

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "HF model directory to serve.", required=True)
flags.DEFINE_string("host", "127.0.0.1", "Bind address (loopback by default).")
flags.DEFINE_integer("port", 8000, "Port (0 = any free port).")
flags.DEFINE_string("served_model_name", "policy", "Model name clients send.")
flags.DEFINE_enum("device", "cpu", ["cpu", "gpu"], "vLLM build / platform.")
flags.DEFINE_string("dtype", "float32", "Weights/activations dtype on the server.")
flags.DEFINE_integer(
  "max_model_len",
  4096,
  "Longest prompt + completion (when not given: "
  "4096, or the model's max_position_embeddings if smaller).",
)
flags.DEFINE_integer(
  "max_num_batched_tokens",
  16384,
  "Token budget per engine step; must cover a batch's prompts (CPU crash "
  "on seeded chunked prefill otherwise).",
)
flags.DEFINE_integer("kv_cache_gb", 1, "CPU KV cache size (GiB).")
flags.DEFINE_float("gpu_memory_utilization", 0.5, "GPU memory fraction for vLLM.")
flags.DEFINE_string("api_key", None, "Require this bearer token.")
flags.DEFINE_string("python", None, "Python of the vLLM environment (default .venvs/vllm).")
flags.DEFINE_enum(
  "weight_transfer",
  None,
  ["rlvr_tcp", "nccl"],
  "Enable vLLM's weight-transfer API with this backend (sampler.weight_sync=transfer): "
  "rlvr_tcp on CPU (the repo's plugin), nccl on GPU. Disk syncs keep working.",
)
flags.DEFINE_bool(
  "routed_experts",
  False,
  "Mixture of experts on a GPU server: return the experts each token was routed to, "
  "for routing replay (rl.learner.routing_replay).",
)

flags.DEFINE_integer(
  "lora_rank",
  0,
  "Serve LoRA adapters of up to this rank, loaded at run time (the RL run's "
  "sampler.lora_adapters pushes one per version); 0 = off.",
)

config_flags.DEFINE_config_file(
  "config", None, "The run's config: the server options it decides come from it."
)
# Flags a --config decides -> the setting each comes from.
FROM_CONFIG = {
  "served_model_name": "sampler.model",
  "max_model_len": "rl.loop / eval.sampling / env lengths",
  "weight_transfer": "sampler.weight_sync and sampler.transfer_backend",
  "lora_rank": "rl.learner.lora.rank with sampler.lora_adapters",
}


def positions(model_dir: str) -> int | None:
  """The model's max_position_embeddings (config.json), None where it does not say."""
  try:
    with open(os.path.join(model_dir, "config.json")) as f:
      n = json.load(f).get("max_position_embeddings")
  except (OSError, ValueError):
    return None
  return int(n) if n else None


def max_model_len(model_dir: str) -> int:
  """--max_model_len; when not given, capped at the model's max_position_embeddings (vLLM
  refuses a longer one, e.g. 4096 on a make_tiny model's 2048 positions)."""
  if FLAGS["max_model_len"].present:
    return FLAGS.max_model_len
  n = positions(model_dir)
  return min(FLAGS.max_model_len, n) if n else FLAGS.max_model_len


def options_from_config(given: dict):
  """The server options of --config's settings (one line for a flag given beside it)."""
  from rlvr.run import experiment, trainer

  for name, source in FROM_CONFIG.items():
    if FLAGS[name].present:
      raise app.UsageError(f"--{name}: --config decides it ({source}); drop --{name}")
  n = positions(FLAGS.model) or FLAGS.max_model_len
  return trainer.server_options(experiment.check(FLAGS.config), n, **given)


def main(argv):
  del argv
  from rlvr.sampling.vllm_server import ServerOptions, start_server

  given = dict(
    host=FLAGS.host,
    port=FLAGS.port or None,
    dtype=FLAGS.dtype,
    max_num_batched_tokens=FLAGS.max_num_batched_tokens,
    kv_cache_gb=FLAGS.kv_cache_gb,
    gpu_memory_utilization=FLAGS.gpu_memory_utilization,
    api_key=FLAGS.api_key,
    routed_experts=FLAGS.routed_experts,
    device=FLAGS.device,
  )
  options = (
    options_from_config(given)
    if FLAGS.config
    else ServerOptions(
      served_model_name=FLAGS.served_model_name,
      max_model_len=max_model_len(FLAGS.model),
      weight_transfer=FLAGS.weight_transfer,
      lora_rank=FLAGS.lora_rank,
      **given,
    )
  )
  server = start_server(FLAGS.model, options, python=FLAGS.python, die_with_parent=False)
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):  # before the line a supervisor may wait for
    signal.signal(sig, lambda *_: stop.set())
  print(
    f"vLLM serving {FLAGS.model} at {server.url} (model name {options.served_model_name!r}, "
    f"max_model_len {options.max_model_len}, up in {server.startup_s:.0f}s, "
    f"log {server.log_path})",
    flush=True,
  )
  while not stop.wait(1.0):
    if not server.alive():
      raise SystemExit(
        f"vLLM server exited (code {server.process.returncode}); log:\n{server.log_tail()}"
      )
  server.stop()
  print("vLLM server stopped", flush=True)


if __name__ == "__main__":
  app.run(main)
