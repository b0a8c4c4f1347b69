r"""Weight sync into a vLLM CPU server: disk (safetensors + reload_weights) vs transfer.

  python bench/weight_sync.py                        # 27M Qwen2, then 1.5B-shaped, bf16
  python bench/weight_sync.py --models=27m --repeats=5

For each model one server (started with the `rlvr_tcp` weight-transfer engine) takes the
same params both ways, `--repeats` times each, alternating; printed side by side: median
seconds, GB/s of the pushed checkpoint (untied, `--sync_dtype`), and the time of the
host gather both paths start with (`hf_tensors` + cast). Each push is checked: the
server reports its version. The 1.5B model has random weights made in bf16 in memory
(~3.6 GB; the server holds its copy plus the transfer's staging); every push sends the
same params (two copies would not fit a 24 GiB machine shared with others).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_configs import CONFIGS  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["27m", "1.5b"], "Configs (bench/model_configs.py), in order.")
flags.DEFINE_integer("repeats", 3, "Pushes per path and model.")
flags.DEFINE_enum("sync_dtype", "bfloat16", ["bfloat16", "float32"], "Dtype pushed.")
flags.DEFINE_integer("bucket_mb", 512, "Transfer bucket size (MiB).")
flags.DEFINE_string("workdir", None, "Where to write models and syncs (default: a temp dir).")


def _policy(name: str, work: str):
  """(config, params in the sync dtype, tokenizer) of a random model with `name`'s shapes."""
  import dataclasses

  import jax
  import jax.numpy as jnp
  from transformers import AutoTokenizer

  from rlvr import model

  tok_dir = model.make_tiny(os.path.join(work, "tok"))  # a tokenizer vLLM can load
  tiny_cfg, _ = model.load_hf(tok_dir)
  cfg = dataclasses.replace(tiny_cfg, **CONFIGS[name])
  params = model.init(cfg, jax.random.key(0), param_dtype=jnp.dtype(FLAGS.sync_dtype))
  return cfg, params, AutoTokenizer.from_pretrained(tok_dir)


def _bench_model(name: str, work: str) -> dict:
  import jax.numpy as jnp

  from rlvr import model
  from rlvr.sampling.vllm_sampler import VLLMSampler, serve_policy_copy
  from rlvr.sampling.vllm_server import ServerOptions, start_server
  from rlvr.sampling.weights import host_tensors

  cfg, params, tok = _policy(name, os.path.join(work, name))
  dtype = jnp.dtype(FLAGS.sync_dtype)
  served = serve_policy_copy(os.path.join(work, name, "served"), cfg, params, tok, dtype=dtype)
  nbytes = sum(int(a.nbytes) for _, a in host_tensors(cfg, params, dtype))
  t = time.perf_counter()
  for _ in host_tensors(cfg, params, dtype):
    pass
  gather_s = time.perf_counter() - t
  print(
    f"model {name}: {model.count_params(cfg) / 1e6:,.0f}M params, pushed "
    f"{nbytes / 1e9:.2f} GB ({FLAGS.sync_dtype}, untied); host gather {gather_s:.2f}s",
    flush=True,
  )
  options = ServerOptions(max_model_len=512, dtype=FLAGS.sync_dtype, weight_transfer="rlvr_tcp")
  server = start_server(served, options, log_path=os.path.join(work, f"vllm-{name}.log"))
  common = dict(model_config=cfg, eos_token_id=tok.eos_token_id, sync_dtype=dtype)
  samplers = {
    "disk": VLLMSampler(server.url, sync_dir=os.path.join(work, name, "sync"), **common),
    "transfer": VLLMSampler(
      server.url, weight_sync="transfer", transfer_bucket_mb=FLAGS.bucket_mb, **common
    ),
  }
  times = {k: [] for k in samplers}
  version = 0
  try:
    for _ in range(FLAGS.repeats):
      for kind, sampler in samplers.items():
        version += 1  # the same params each time: a second copy would not fit at 1.5B
        t = time.perf_counter()
        sampler.update_weights(params, version)
        times[kind].append(time.perf_counter() - t)
        got = sampler._session().get(server.url + "/weight_info").json()["weight_version"]
        assert got == str(version), (kind, got, version)
  finally:
    for s in samplers.values():
      s.close()
    server.stop()
  med = {k: statistics.median(v) for k, v in times.items()}
  for kind in samplers:
    print(
      f"  {kind:8s} {med[kind]:7.2f}s  {nbytes / med[kind] / 1e9:6.2f} GB/s  "
      f"(median of {FLAGS.repeats}: {', '.join(f'{x:.2f}' for x in times[kind])})",
      flush=True,
    )
  print(f"  transfer / disk time: {med['transfer'] / med['disk']:.2f}x", flush=True)
  return dict(name=name, gb=nbytes / 1e9, gather_s=gather_s, **med)


def main(argv):
  del argv
  import jax

  jax.config.update("jax_platforms", "cpu")
  work = FLAGS.workdir or tempfile.mkdtemp(prefix="bench_weight_sync_")
  rows = [_bench_model(name, work) for name in FLAGS.models]
  print("\n| model | pushed (GB) | disk (s) | disk (GB/s) | transfer (s) | transfer (GB/s) |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['name']} | {r['gb']:.2f} | {r['disk']:.2f} | {r['gb'] / r['disk']:.2f} | "
      f"{r['transfer']:.2f} | {r['gb'] / r['transfer']:.2f} |"
    )
  big = rows[-1]
  print(f"\nprojection from {big['name']}'s bandwidths (bf16 checkpoint, one server):")
  print("| model | checkpoint (GB) | disk (s) | transfer (s) |")
  print("|---|---|---|---|")
  for label, params_b in (("7B", 7.6), ("32B", 32.8)):
    gb = params_b * 2
    print(
      f"| {label} | {gb:.0f} | {gb / (big['gb'] / big['disk']):.0f} | "
      f"{gb / (big['gb'] / big['transfer']):.0f} |"
    )


if __name__ == "__main__":
  app.run(main)
