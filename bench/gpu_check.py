r"""One-GPU health and speed check: numerics, matmul peak, learner, attention, sampler.

  python bench/gpu_check.py                    # one H100 / H200: Qwen2.5-1.5B shapes, < 8 min
  python bench/gpu_check.py --json=check.json  # also write the JSON there
  JAX_PLATFORMS=cpu python bench/gpu_check.py --small   # tiny shapes, seconds (the test)

Prints ONE JSON object to stdout (progress goes to stderr), with random weights:
  platform, device_kind, jax_version, devices
  bf16_vs_f32        logits of the same params and tokens in bf16 vs f32 compute (f32
                     matmuls at "highest" precision): max / mean abs difference, max abs logit
  matmul_peak_tflops best bf16 square-matmul rate measured here (an upper bound for MFU)
  learner            update step (bf16 compute, remat) at T=4096 per attention
                     ("blockwise"; "cudnn" on GPU): s/step, tokens/s, MFU against the peak
  attention          forward + backward of attention alone in bf16 (Qwen2.5-1.5B heads),
                     and each output's max abs difference from f32 dense on a shorter T
  sampler            JaxSampler decode tokens/s (compile excluded, reported apart)
  total_seconds
A measurement that fails records {"error": "<type>: <msg>"} and the rest still run.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_configs import CONFIGS, model_flops_per_token  # noqa: E402

from rlvr.model.tiny import TINY  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_bool("small", False, "Tiny shapes for CPU (the test): seconds, not minutes.")
flags.DEFINE_string("json", "", "Also write the JSON here.")

# Every size the check uses; --small swaps in the second set.
FULL = dict(
  model=CONFIGS["1.5b"],
  fwd_rows=2,
  fwd_t=512,
  matmul_sizes=(4096, 8192, 16384),
  matmul_repeats=5,
  matmul_calls=4,
  learner_rows=2,
  learner_t=4096,
  learner_steps=3,
  attn_t=4096,
  attn_heads=(12, 2, 128),
  attn_check_t=2048,
  attn_repeats=5,
  prompts=64,
  prompt_len=64,
  new_tokens=256,
)
SMALL = dict(
  model=dict(TINY, vocab_size=512),
  fwd_rows=1,
  fwd_t=32,
  matmul_sizes=(512, 1024),
  matmul_repeats=3,
  matmul_calls=2,
  learner_rows=2,
  learner_t=128,
  learner_steps=2,
  attn_t=256,
  attn_heads=(4, 2, 16),
  attn_check_t=128,
  attn_repeats=3,
  prompts=4,
  prompt_len=8,
  new_tokens=16,
)

_START = time.perf_counter()
GPU_ONLY = {"skipped": "needs a GPU"}


def _log(msg: str) -> None:
  print(f"[gpu_check {time.perf_counter() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _guarded(name: str, fn, *args):
  """fn(*args), or {"error": ...} if it raises (traceback to stderr)."""
  _log(f"{name} ...")
  t = time.perf_counter()
  try:
    out = fn(*args)
  except Exception as e:  # noqa: BLE001 -- one failure must not lose the rest
    traceback.print_exc(file=sys.stderr)
    out = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
  _log(f"{name} done in {time.perf_counter() - t:.1f}s: {json.dumps(out)[:300]}")
  return out


def _best_time(fn, repeats: int) -> float:
  """Best wall time of `repeats` calls of fn (each waited for)."""
  import jax

  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t)
  return best


# ------------------------------------------------------------------ measurements
def bf16_vs_f32(cfg, params, s):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from rlvr import model

  tokens = jnp.asarray(
    np.random.RandomState(1).randint(0, cfg.vocab_size, (s["fwd_rows"], s["fwd_t"])), jnp.int32
  )
  fwd = jax.jit(
    lambda p, x, dt: model.forward(jax.tree.map(lambda a: a.astype(dt), p), x, config=cfg),
    static_argnums=2,
  )
  lo = fwd(params, tokens, jnp.bfloat16)
  with jax.default_matmul_precision("highest"):  # no TF32: a true f32 reference
    hi = fwd(params, tokens, jnp.float32)
  diff = jnp.abs(lo - hi)
  return dict(
    rows=s["fwd_rows"],
    t=s["fwd_t"],
    max_abs_diff=float(diff.max()),
    mean_abs_diff=float(diff.mean()),
    max_abs_logit=float(jnp.abs(hi).max()),
    f32_matmul_precision="highest",
  )


def matmul_peak_tflops(s) -> float:
  import jax
  import jax.numpy as jnp

  mm = jax.jit(lambda a, b: a @ b)
  best = 0.0
  for n in s["matmul_sizes"]:
    ka, kb = jax.random.split(jax.random.key(n))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    mm(a, b).block_until_ready()
    calls = s["matmul_calls"]  # queued back to back, so dispatch hides behind compute
    dt = (
      _best_time(
        lambda a=a, b=b, calls=calls: [mm(a, b) for _ in range(calls)], s["matmul_repeats"]
      )
      / calls
    )
    _log(f"  matmul {n}: {2 * n**3 / dt / 1e12:.1f} TFLOP/s")
    best = max(best, 2 * n**3 / dt / 1e12)
    del a, b
  return best


def learner_step(cfg, params, s, attention_impl: str, peak_tflops):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from rlvr import learner
  from rlvr.parallel import sharding

  rows, t = s["learner_rows"], s["learner_t"]
  lc = learner.LearnerConfig(compute_dtype="bfloat16", remat=True, attention=attention_impl)
  mesh = sharding.make_mesh({"fsdp": -1}, devices=jax.devices()[:1])
  rng = np.random.RandomState(2)
  mask = np.zeros((rows, t), np.float32)
  mask[:, t // 4 :] = 1  # prompt, then the completion in the loss
  batch = learner.TrainBatch(
    tokens_bt=jnp.asarray(rng.randint(0, cfg.vocab_size, (rows, t)), jnp.int32),
    segment_bt=jnp.ones((rows, t), jnp.int32),
    loss_mask_bt=jnp.asarray(mask),
    advantages=jnp.asarray(rng.randn(rows), jnp.float32),
  )
  state = learner.init_state(cfg, lc, params, mesh)
  update = learner.make_update_fn(cfg, lc, mesh)
  t0 = time.perf_counter()
  state, m = update(state, batch)
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(s["learner_steps"]):
    state, m = update(state, batch)
  jax.block_until_ready(m)
  step_s = (time.perf_counter() - t0) / s["learner_steps"]
  del state
  out = dict(
    rows=rows,
    t=t,
    step_s=step_s,
    tokens_per_s=rows * t / step_s,
    model_tflops_per_step=model_flops_per_token(cfg, t) * rows * t / 1e12,
    compile_s=compile_s,
    loss=float(m["loss"]),
  )
  if isinstance(peak_tflops, float) and peak_tflops > 0:
    out["mfu"] = out["model_tflops_per_step"] / step_s / peak_tflops
  return out


def _attention_inputs(b, t, heads, dtype, seed):
  """Normal q, k, v in `dtype` and an f32 output weight (numpy-drawn: nothing to compile)."""
  import jax.numpy as jnp
  import numpy as np

  h, kvh, hd = heads
  rng = np.random.RandomState(seed)
  draw = lambda *shape: jnp.asarray(rng.randn(*shape).astype(np.float32))  # noqa: E731
  return (
    draw(b, t, h, hd).astype(dtype),
    draw(b, t, kvh, hd).astype(dtype),
    draw(b, t, kvh, hd).astype(dtype),
    draw(b, t, h * hd),
  )


def _attention_fns(gpu: bool):
  import jax.numpy as jnp

  from rlvr.model import attention as A

  def dense(q, k, v, seg):
    pos = jnp.arange(q.shape[1])
    return A.dense_attention(q, k, v, seg, seg, pos, pos)

  fns = {"dense": dense, "blockwise": A.blockwise_attention}
  if gpu:
    fns["cudnn"] = lambda q, k, v, seg: A.fused_attention(q, k, v, seg, "cudnn")
  return fns


def attention_fwd_bwd(fn, s):
  """ms of one forward + backward (grads of q, k, v) at T=attn_t, B=1, bf16."""
  import jax
  import jax.numpy as jnp

  q, k, v, w = _attention_inputs(1, s["attn_t"], s["attn_heads"], jnp.bfloat16, 3)
  seg = jnp.ones(q.shape[:2], jnp.int32)
  step = jax.jit(
    jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, seg).astype(jnp.float32) * w), argnums=(0, 1, 2))
  )
  t0 = time.perf_counter()
  jax.block_until_ready(step(q, k, v))
  compile_s = time.perf_counter() - t0
  return dict(
    fwd_bwd_ms=_best_time(lambda: step(q, k, v), s["attn_repeats"]) * 1e3, compile_s=compile_s
  )


@functools.lru_cache(maxsize=1)
def _check_case(t: int, heads: tuple):
  """f32 inputs on two rows (the first right-padded), its real positions, f32 dense output."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  q, k, v, _ = _attention_inputs(2, t, heads, jnp.float32, 4)
  seg = np.ones((2, t), np.int32)
  seg[0, 3 * t // 4 :] = 0
  with jax.default_matmul_precision("highest"):
    want = np.asarray(jax.jit(_attention_fns(False)["dense"])(q, k, v, jnp.asarray(seg)))
  return (q, k, v, jnp.asarray(seg)), seg.astype(bool), want


def attention_diff(name, fn, s):
  """Max abs difference from f32 dense at real positions. Inputs: f32 for blockwise;
  rounded to bf16 for cudnn (bf16 only) and for dense itself (the bf16 rounding
  error alone: the yardstick for cudnn's)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  (q, k, v, seg), real, want = _check_case(s["attn_check_t"], s["attn_heads"])
  dt = jnp.float32 if name == "blockwise" else jnp.bfloat16
  with jax.default_matmul_precision("highest" if dt == jnp.float32 else None):
    got = jax.jit(fn)(q.astype(dt), k.astype(dt), v.astype(dt), seg)
  got = np.asarray(got.astype(jnp.float32))
  return dict(
    t=s["attn_check_t"],
    input_dtype=jnp.dtype(dt).name,
    max_abs_vs_dense_f32=float(np.abs(got - want)[real].max()),
  )


def sampler_decode(cfg, params, s):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from rlvr.sampling import JaxSampler, SamplingParams

  sampler = JaxSampler(cfg, jax.tree.map(lambda a: a.astype(jnp.bfloat16), params), None)
  rng = np.random.RandomState(5)
  prompts = [
    [int(x) for x in rng.randint(0, cfg.vocab_size, s["prompt_len"])] for _ in range(s["prompts"])
  ]
  sp = SamplingParams(
    n=1, temperature=1.0, max_tokens=s["new_tokens"], seed=0, logprobs=False, ignore_eos=True
  )
  t0 = time.perf_counter()
  sampler.generate(prompts, sp)
  first_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  outs = sampler.generate(prompts, sp)
  dt = time.perf_counter() - t0
  n = sum(len(c.token_ids) for g in outs for c in g)
  return dict(
    prompts=s["prompts"],
    prompt_len=s["prompt_len"],
    new_tokens=s["new_tokens"],
    generated=n,
    seconds=dt,
    tokens_per_s=n / dt,
    compile_s=max(first_s - dt, 0.0),
    dtype="bfloat16",
    note="prefill included; EOS ignored",
  )


# ------------------------------------------------------------------ main
def main(argv):
  del argv
  import jax

  from rlvr import model

  s = SMALL if FLAGS.small else FULL
  dev = jax.devices()[0]
  gpu = dev.platform == "gpu"
  cfg = model.ModelConfig(**s["model"])
  out = dict(
    platform=dev.platform,
    device_kind=dev.device_kind,
    jax_version=jax.__version__,
    devices=jax.device_count(),
    small=FLAGS.small,
  )
  _log(f"{dev.device_kind} ({dev.platform}); model {model.count_params(cfg) / 1e6:.1f}M params")

  params = jax.jit(lambda key: model.init(cfg, key))(jax.random.key(0))  # f32
  out["bf16_vs_f32"] = _guarded("bf16_vs_f32", bf16_vs_f32, cfg, params, s)
  out["matmul_peak_tflops"] = _guarded("matmul_peak_tflops", matmul_peak_tflops, s)

  peak = out["matmul_peak_tflops"]
  out["learner"] = {
    "blockwise": _guarded("learner blockwise", learner_step, cfg, params, s, "blockwise", peak)
  }
  out["learner"]["cudnn"] = (
    _guarded("learner cudnn", learner_step, cfg, params, s, "cudnn", peak) if gpu else GPU_ONLY
  )

  fns = _attention_fns(gpu)
  h, kvh, hd = s["attn_heads"]
  out["attention"] = dict(
    t=s["attn_t"], batch=1, q_heads=h, kv_heads=kvh, head_dim=hd, dtype="bfloat16"
  )
  for name in ("dense", "blockwise", "cudnn"):
    if name not in fns:
      out["attention"][name] = GPU_ONLY
      continue
    out["attention"][name] = dict(
      _guarded(f"attention {name}", attention_fwd_bwd, fns[name], s),
      diff=_guarded(f"attention {name} diff", attention_diff, name, fns[name], s),
    )

  out["sampler"] = _guarded("sampler", sampler_decode, cfg, params, s)
  out["total_seconds"] = time.perf_counter() - _START
  text = json.dumps(out, indent=2)
  print(text, flush=True)
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  app.run(main)
