r"""Memory plan of a config's update step, from the compiler: nothing runs, no weights exist.

  python bench/plan.py --config=configs/svs_dapo17k_qwen25_32b.py --devices=32
  python bench/plan.py --config=configs/rlvr_math12k_qwen25_3b.py --devices=8 --json=plan.json

Compiles `learner.train_step` for --devices fake CPU devices on the config's mesh,
with the model shapes of --model (default: read off the config's name; see
bench/model_configs.PAPER_MODELS, or --hf_config=DIR/config.json) and one
mini-batch of the config (rl.learner.ppo_mini_batch_size groups x group_size rows,
prompt + response tokens). Prints per device what XLA's memory analysis reports:
parameters, optimizer state (both from the shardings), the step's inputs and
temporaries, the total against --budget_gib, and model FLOPs per step from XLA's
cost analysis; and the same for the old-logprob pass a multi-step update runs first
(`learner.make_logprob_fn`). CPU compilation stands in for the accelerator's: buffer sizes
and layouts match, fusion decisions can differ.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_configs import PAPER_MODELS  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config.", lock_config=True)
flags.DEFINE_integer("devices", 8, "Fake devices to compile for (the paper's GPU count).")
flags.DEFINE_string(
  "model",
  "",
  f"Model shapes: one of {sorted(PAPER_MODELS)}, 'config' (the "
  "config's model: its model.path, or its tiny model); default from the name.",
)
flags.DEFINE_string("hf_config", "", "An HF config.json to take the shapes from instead.")
flags.DEFINE_float("budget_gib", 80.0, "HBM per device (H100: 80).")
flags.DEFINE_string("json", "", "Also write the plan here.")

GIB = 1024**3


def _model_config(cfg):
  from rlvr.model.config import ModelConfig

  if FLAGS.hf_config:
    with open(FLAGS.hf_config) as f:
      return ModelConfig.from_hf(json.load(f)), FLAGS.hf_config
  key = FLAGS.model or next(
    (k for k in PAPER_MODELS if os.path.basename(cfg.workdir).endswith(k)), "config"
  )
  if key == "config":
    from rlvr.run import workdir

    path = workdir.prepare_model(cfg.model)
    return ModelConfig.from_hf(path), path
  if key not in PAPER_MODELS:
    raise app.UsageError(f"--model: unknown {key!r}; expected one of {sorted(PAPER_MODELS)}")
  return ModelConfig.from_hf(PAPER_MODELS[key]), key


def _bytes_per_device(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
  import jax

  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape)
    total += math.prod(shard) * x.dtype.itemsize
  return total


def _params(c) -> tuple[int, int]:
  """(all parameters, those one token uses): a sparse layer runs k of its E experts."""
  import jax

  from rlvr.model import decoder

  n = sum(math.prod(x.shape) for x in jax.tree.leaves(decoder.param_shapes(c)))
  idle = c.num_experts - c.num_experts_per_tok
  per_expert = 3 * c.hidden_size * c.moe_intermediate_size
  return n, n - c.num_sparse_layers * idle * per_expert


def _model_flops(c, rows: int, t: int) -> float:
  """Training FLOPs of one step on rows x t tokens (all of them; padding not discounted),
  counting the parameters each token uses (the active ones of a mixture of experts)."""
  attn = 6 * c.num_layers * c.num_heads * c.head_dim * t / 2
  return rows * t * (6 * _params(c)[1] + attn)


def plan(cfg, devices: int) -> dict:
  import jax
  import jax.numpy as jnp

  from rlvr import learner, rollout
  from rlvr.common import settings
  from rlvr.parallel import sharding
  from rlvr.run import checkpoint

  model_cfg, model_name = _model_config(cfg)
  lc = settings.frozen(learner.LearnerConfig, cfg.rl.learner)
  rl = settings.frozen(rollout.RLConfig, cfg.rl.loop)
  mesh = sharding.make_mesh(cfg.mesh.to_dict())
  state = checkpoint.abstract_state(model_cfg, lc, mesh)
  rows, t = rl.batch_shape.mini_batch_rows(lc), rl.seq_len
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
  # Packed (rl.learner.pack): at most as many rows as unpacked, each sequence's positions and
  # per-token advantages and truncation flags; the shapes of the worst case are compiled.
  per_row = (rows, t) if lc.pack else (rows,)
  batch = learner.TrainBatch(
    tokens_bt=spec((rows, t), jnp.int32),
    segment_bt=spec((rows, t), jnp.int32),
    loss_mask_bt=spec((rows, t), jnp.float32),
    advantages=spec(per_row, jnp.float32),
    old_logp_bt=spec((rows, t), jnp.float32),
    sampler_logp_bt=spec((rows, t), jnp.float32),
    truncated=spec(per_row, jnp.bool_),
    positions_bt=spec((rows, t), jnp.int32) if lc.pack else None,
  )
  # XLA's CPU compiler runs bf16 dots in f32 and hoists the upcast of a bf16 layer stack out
  # of the layer loop: an f32 copy of the whole frozen base of a LoRA state (28 GiB at 7B), which
  # an accelerator's native bf16 dots never make. Such a plan is compiled without that hoist.
  base = getattr(state, "base", None)
  opts = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"} if base is not None else {}
  lowered = learner.jit_train_step(model_cfg, lc, mesh, batch).lower(state, batch)
  compiled = lowered.compile(compiler_options=opts)
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  params = _bytes_per_device(state.params)
  opt = _bytes_per_device(state.opt_state)
  # LoRA: params are the adapters; the frozen base (compute dtype) rides in the state.
  frozen = _bytes_per_device(base) if base is not None else 0
  inputs, temps = mem.argument_size_in_bytes, mem.temp_size_in_bytes
  # Outputs alias the donated state; what is not aliased needs room of its own.
  outputs = max(mem.output_size_in_bytes - mem.alias_size_in_bytes, 0)
  total = inputs + temps + outputs
  # The old-logprob pass of a multi-step update (learner.make_logprob_fn), on the same
  # mini-batch and mesh; the optimizer state stays resident beside it.
  placed = lambda x: jax.ShapeDtypeStruct(
    x.shape, x.dtype, sharding=sharding.batch_sharding(mesh, len(x.shape))
  )
  logp_fn = jax.jit(functools.partial(learner.batch_logprobs, model_cfg=model_cfg, cfg=lc))
  # With LoRA it scores the base with the adapters beside it (the state's own arrays).
  policy = learner.policy_weights(state)
  lp_mem = logp_fn.lower(policy, jax.tree.map(placed, batch)).compile(opts).memory_analysis()
  lp_total = (
    opt + lp_mem.argument_size_in_bytes + lp_mem.temp_size_in_bytes + lp_mem.output_size_in_bytes
  )
  dp = mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]
  return {
    "config": cfg.workdir,
    "model": model_name,
    "params_b": _params(model_cfg)[0] / 1e9,
    "trained_params_b": sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)) / 1e9,
    "lora_rank": lc.lora.rank,
    "active_params_b": _params(model_cfg)[1] / 1e9,
    "devices": devices,
    "mesh": dict(mesh.shape),
    "rows_per_step": rows,
    "seq_len": t,
    "micro_batches": lc.micro_count(rows),
    "rows_per_device_per_micro_batch": rows / lc.micro_count(rows) / dp,
    "remat": lc.remat,
    "compute_dtype": lc.compute_dtype,
    "attention": lc.attention,
    "packed": lc.pack,
    "gib_per_device": {
      "params": params / GIB,
      "frozen base (LoRA)": frozen / GIB,
      "optimizer": opt / GIB,
      "inputs (state + batch)": inputs / GIB,
      "temporaries (grads, activations)": temps / GIB,
      "outputs not aliased": outputs / GIB,
      "total": total / GIB,
    },
    "old_logprobs_gib_per_device": {
      "temporaries": lp_mem.temp_size_in_bytes / GIB,
      "total (with the optimizer state)": lp_total / GIB,
    },
    "budget_gib": FLAGS.budget_gib,
    "fits": max(total, lp_total) / GIB <= FLAGS.budget_gib,
    # 6 N per token (forward + backward; N: the parameters a token uses, the active ones
    # of a mixture of experts) plus causal attention (6 L h d T / 2 per token),
    # spread over the devices; XLA's own count visits loop bodies (layers, micro-batches)
    # once, so it is reported as is, for what it is.
    "model_tflops_per_step_per_device": _model_flops(model_cfg, rows, t) / devices / 1e12,
    "xla_tflops_loop_bodies_once": float(cost.get("flops", float("nan"))) / 1e12,
  }


def main(argv):
  del argv
  import jax

  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", FLAGS.devices)
  out = plan(FLAGS.config, FLAGS.devices)
  g = out["gib_per_device"]
  print(
    f"{out['config']}: {out['model']} ({out['params_b']:.1f}B, {out['active_params_b']:.1f}B "
    f"active{', LoRA rank %d: %.3fB trained' % (out['lora_rank'], out['trained_params_b']) if out['lora_rank'] else ''}) "
    f"on {out['devices']} devices "
    f"{out['mesh']}, {out['rows_per_step']} rows x {out['seq_len']} tokens, "
    f"{out['micro_batches']} micro-batches ({out['rows_per_device_per_micro_batch']:g} "
    f"rows/device each), packed={out['packed']}, remat={out['remat']}, "
    f"{out['compute_dtype']}, attention={out['attention']}"
  )
  for k, v in g.items():
    print(f"  {k:34s} {v:8.2f} GiB")
  lp = out["old_logprobs_gib_per_device"]
  print(
    f"  {'old-logprob pass, total':34s} {lp['total (with the optimizer state)']:8.2f} GiB "
    f"(temporaries {lp['temporaries']:.2f})"
  )
  print(
    f"  {'budget':34s} {out['budget_gib']:8.2f} GiB -> {'fits' if out['fits'] else 'DOES NOT FIT'}"
  )
  print(
    f"  model TFLOPs per step per device: {out['model_tflops_per_step_per_device']:.1f} "
    f"(XLA, loop bodies once: {out['xla_tflops_loop_bodies_once']:.1f})"
  )
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  app.run(main)
