r"""Decode throughput: JaxSampler vs the vLLM CPU server on the same model and work.

  python bench/sampling.py                 # 27M Qwen2, 16 prompts x 32 tokens, n 8, 128 new
  python bench/sampling.py --model=1.5b --skip_vllm --dtype=bfloat16   # accelerator run

Prints decode tokens/s of each, their ratio, and vLLM weight-sync latency.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_configs import CONFIGS  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "27m", ["27m", "1.5b"], "Config (bench/model_configs.py).")
flags.DEFINE_integer("prompts", 16, "Prompts per call.")
flags.DEFINE_integer("prompt_len", 32, "Tokens per prompt.")
flags.DEFINE_integer("n", 8, "Samples per prompt.")
flags.DEFINE_integer("new_tokens", 128, "Tokens generated per sample (EOS ignored).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Sampler dtype.")
flags.DEFINE_bool("skip_vllm", False, "Only run JaxSampler.")
flags.DEFINE_string("workdir", None, "Where to write the model (default: a temp dir).")


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  from transformers import AutoTokenizer

  from rlvr import model
  from rlvr.sampling import JaxSampler, SamplingParams

  work = FLAGS.workdir or tempfile.mkdtemp(prefix="bench_sampling_")
  kw = dict(CONFIGS[FLAGS.model])
  path = model.make_tiny(os.path.join(work, "model"), **kw)
  cfg, params = model.load_hf(path, dtype=jnp.float32 if FLAGS.dtype == "float32" else jnp.bfloat16)
  tok = AutoTokenizer.from_pretrained(path)
  rng = np.random.RandomState(0)
  prompts = [[int(t) for t in rng.randint(3, 700, FLAGS.prompt_len)] for _ in range(FLAGS.prompts)]
  sp = SamplingParams(
    n=FLAGS.n, temperature=1.0, max_tokens=FLAGS.new_tokens, seed=0, ignore_eos=True
  )
  work_tokens = FLAGS.prompts * FLAGS.n * FLAGS.new_tokens
  print(
    f"model {FLAGS.model}: {model.count_params(cfg) / 1e6:.1f}M params; {FLAGS.prompts} "
    f"prompts x {FLAGS.prompt_len} tokens, n {FLAGS.n}, {FLAGS.new_tokens} new tokens "
    f"({work_tokens} generated); {FLAGS.dtype}; backend {jax.default_backend()}"
  )

  jax_sampler = JaxSampler(cfg, params, tok)
  t = time.perf_counter()
  jax_sampler.generate(prompts, sp)
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  outs = jax_sampler.generate(prompts, sp)
  jax_s = time.perf_counter() - t
  assert sum(len(c.token_ids) for g in outs for c in g) == work_tokens
  print(
    f"JaxSampler: {jax_s:.2f}s  {work_tokens / jax_s:,.0f} tokens/s  "
    f"(first call incl. compile {compile_s:.1f}s)"
  )
  if FLAGS.skip_vllm:
    return

  from rlvr.sampling.vllm_sampler import VLLMSampler, serve_policy_copy
  from rlvr.sampling.vllm_server import ServerOptions, start_server

  served = serve_policy_copy(os.path.join(work, "served"), cfg, params, tokenizer=tok)
  server = start_server(served, ServerOptions(max_model_len=1024))
  try:
    print(f"vLLM server start-up: {server.startup_s:.1f}s")
    client = VLLMSampler(
      server.url,
      model_config=cfg,
      eos_token_id=tok.eos_token_id,
      sync_dir=os.path.join(work, "sync"),
      max_concurrency=FLAGS.prompts,
    )
    client.generate(prompts[:2], SamplingParams(n=2, max_tokens=8, seed=0))  # warm-up
    t = time.perf_counter()
    outs = client.generate(prompts, sp)
    vllm_s = time.perf_counter() - t
    assert sum(len(c.token_ids) for g in outs for c in g) == work_tokens
    print(f"vLLM CPU:   {vllm_s:.2f}s  {work_tokens / vllm_s:,.0f} tokens/s")
    print(f"ratio JaxSampler/vLLM tokens/s: {vllm_s / jax_s:.2f}x")
    lat = []
    for v in range(1, 4):
      t = time.perf_counter()
      client.update_weights(params, version=v)
      lat.append(time.perf_counter() - t)
    print(
      f"vLLM weight sync (save_hf + reload_weights + reset_prefix_cache): "
      f"{np.median(lat):.2f}s median of {len(lat)}"
    )
    client.close()
  finally:
    server.stop()


if __name__ == "__main__":
  app.run(main)
