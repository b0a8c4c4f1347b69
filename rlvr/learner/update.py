"""The update step: the micro-batch loss (policy loss, KL, router terms), gradient
accumulation over micro-batches in `train_step`, and its sharded jit (`jit_train_step`,
`make_update_fn`)."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import optax

from rlvr import objectives
from rlvr.learner import nonfinite
from rlvr.learner.config import LearnerConfig, TrainBatch
from rlvr.learner.logprobs import (
  completion_mask,
  loss_mask,
  sequence_logprobs,
  sequence_logprobs_routing,
  split_micro,
)
from rlvr.learner.state import (
  LORA_DROPOUT,
  TrainState,
  learning_rate_schedule,
  make_optimizer,
  reference_params,
  state_shardings,
)
from rlvr.model import decoder
from rlvr.model import lora as lora_lib
from rlvr.model import moe as moe_lib
from rlvr.model.config import ModelConfig
from rlvr.parallel import sharding


def micro_loss(
  params,
  ref_params,
  batch: TrainBatch,
  normalizer,
  model_cfg: ModelConfig,
  cfg: LearnerConfig,
  mesh=None,
  micro_share=1.0,
  acc=None,
):
  """Loss of one micro-batch (already divided by the whole batch's normaliser) and sums.
  micro_share: 1 / the number of micro-batches (weights the router losses); acc: the
  running gradient sum (cfg.accumulate_in_backward): the gradient of the layer stacks
  then comes back with it added."""
  mask = loss_mask(batch, cfg)
  logp, entropy, routing = sequence_logprobs_routing(params, batch, model_cfg, cfg, mesh, acc)
  old = jax.lax.stop_gradient(logp) if batch.old_logp_bt is None else batch.old_logp_bt
  tokens = jnp.sum(mask).astype(jnp.float32)
  sums = {
    "tokens": tokens,
    "entropy": objectives.masked_sum(entropy, mask),
    "logp": objectives.masked_sum(jax.lax.stop_gradient(logp), mask),
  }
  is_weight = None
  if batch.sampler_logp_bt is not None:
    is_weight, mismatch = objectives.truncated_is_weight(
      old,
      batch.sampler_logp_bt,
      mask,
      cfg.tis_cap,
      cfg.tis_level,
      cfg.seq_mask_cap,
      batch.sequences_bt,
    )
    if cfg.seq_mask_cap is not None:
      # a share of sequences: summed as counts, divided by the batch's count in train_step
      sequences = objectives.loss_normalizer(mask, "seq-mean-token-mean", batch.sequences_bt)
      sums["seq_masked"] = mismatch.pop("seq_masked_frac") * sequences
      sums["sequences"] = sequences
    sums.update({k: v * tokens for k, v in mismatch.items()})
    if cfg.tis_cap is None and cfg.seq_mask_cap is None:
      is_weight = None
  loss, aux = objectives.policy_loss(
    logp,
    old,
    batch.advantages,
    mask,
    cfg.eps_low,
    cfg.eps_high,
    cfg.dual_clip,
    cfg.aggregation,
    normalizer,
    is_weight,
    batch.sequences_bt,
    cfg.policy_loss,
  )
  for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean"):
    sums[k] = aux[k] * tokens
  extrema = {"ratio_max": aux["ratio_max"], "ratio_min": aux["ratio_min"]}
  sums["pg_loss"] = loss
  if cfg.kl_beta > 0:
    ref_batch = batch.replace(old_logp_bt=None)
    ref_logp, _ = sequence_logprobs(ref_params, ref_batch, model_cfg, cfg, mesh)
    kl = objectives.kl_penalty(logp, jax.lax.stop_gradient(ref_logp), cfg.kl_estimator)
    sums["kl"] = objectives.masked_sum(kl, mask)
    loss = loss + cfg.kl_beta * objectives.aggregate(
      kl, mask, cfg.aggregation, normalizer, batch.sequences_bt
    )
  if routing is not None:
    loss = loss + _router_terms(routing, mask, sums, model_cfg, cfg, micro_share)
    if batch.routes_bt is not None:  # the experts used here vs the sampler's, as sets
      given = jnp.moveaxis(batch.routes_bt, 2, 0)
      real = jnp.all(given >= 0, -1) & (batch.segment_bt > 0)[None]
      differ = jnp.any(jnp.sort(given, -1) != jnp.sort(routing.experts, -1), -1)
      sums["routing_differ"] = jnp.sum(differ & real).astype(jnp.float32)
      sums["routing_checked"] = jnp.sum(real).astype(jnp.float32)
  return loss, (sums, extrema)


def _router_terms(routing, mask, sums, model_cfg: ModelConfig, cfg: LearnerConfig, share):
  """Adds the routing statistics to `sums`; returns the router losses' share of the loss
  (each is a mean over this micro-batch's loss tokens, weighted by `share`, the
  micro-batch's part of the batch, so one micro-batch gives the batch's own)."""
  e = model_cfg.num_experts
  logits = jax.lax.stop_gradient(routing.logits)
  sums.update(moe_lib.routing_sums(logits, routing.experts, mask, e))
  extra = 0.0
  if cfg.moe_aux_loss_coef:
    aux = moe_lib.load_balance_loss(routing.logits, routing.experts, mask, e)
    sums["moe_aux_loss"] = jax.lax.stop_gradient(aux) * sums["tokens"]
    extra = extra + cfg.moe_aux_loss_coef * share * aux
  if cfg.moe_z_loss_coef:
    z = moe_lib.router_z_loss(routing.logits, mask)
    sums["moe_z_loss"] = jax.lax.stop_gradient(z) * sums["tokens"]
    extra = extra + cfg.moe_z_loss_coef * share * z
  return extra


def train_step(
  state: TrainState,
  batch: TrainBatch,
  *,
  model_cfg: ModelConfig,
  cfg: LearnerConfig,
  tx: optax.GradientTransformation,
  mesh=None,
):
  """One optimizer step on `batch` (pure; jitted by `make_update_fn`; mesh: the one it is
  jitted for, handed to the model's forward). A loss or gradient norm that is not finite
  returns the state unchanged; metrics[`nonfinite.LEAF`] names the first parameter whose
  gradient is not finite (`nonfinite`)."""
  counted = completion_mask(batch) if cfg.normalize_all else loss_mask(batch, cfg)
  normalizer = objectives.loss_normalizer(counted, cfg.aggregation, batch.sequences_bt)
  loss_fn = micro_loss
  if cfg.lora.rank:
    # One dropout mask per step, shared by the micro-batches: 1 or k give the same step.
    dropout_rng = jax.random.fold_in(state.rng, LORA_DROPOUT)

    def loss_fn(adapters, *args):
      dropped = lora_lib.drop(adapters, cfg.lora, dropout_rng)
      return micro_loss(lora_lib.Adapted(state.base, dropped, cfg.lora), *args)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  micro = split_micro(batch, cfg.micro_count(batch.tokens_bt.shape[0]))
  share = 1.0 / micro.tokens_bt.shape[0]

  # With accumulate_in_backward the stacks' gradients come back already summed into grads_acc.
  in_backward = (
    {g.name for g in decoder.layer_groups(model_cfg)} if cfg.accumulate_in_backward else set()
  )

  def body(carry, mb):
    grads_acc, sums_acc, ext_acc = carry
    acc = grads_acc if in_backward else None
    (loss, (sums, ext)), grads = grad_fn(
      state.params, reference_params(state), mb, normalizer, model_cfg, cfg, mesh, share, acc
    )
    sums = dict(sums, loss=loss)
    if in_backward:
      grads_acc = {
        k: grads[k] if k in in_backward else jax.tree.map(jnp.add, grads_acc[k], grads[k])
        for k in grads
      }
    else:
      grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
    sums_acc = jax.tree.map(jnp.add, sums_acc, sums)
    ext_acc = {
      "ratio_max": jnp.maximum(ext_acc["ratio_max"], ext["ratio_max"]),
      "ratio_min": jnp.minimum(ext_acc["ratio_min"], ext["ratio_min"]),
    }
    return (grads_acc, sums_acc, ext_acc), None

  zeros = jax.tree.map(jnp.zeros_like, state.params)
  first = jax.tree.map(lambda x: x[0], micro)
  sums_shape = jax.eval_shape(
    lambda: loss_fn(
      state.params, reference_params(state), first, normalizer, model_cfg, cfg, mesh, share
    )[1][0]
  )
  sums0 = {k: jnp.zeros(v.shape, jnp.float32) for k, v in sums_shape.items()}
  sums0["loss"] = jnp.zeros((), jnp.float32)
  ext0 = {"ratio_max": jnp.array(-jnp.inf), "ratio_min": jnp.array(jnp.inf)}
  (grads, sums, ext), _ = jax.lax.scan(body, (zeros, sums0, ext0), micro)

  grad_norm, bad_leaf = nonfinite.grad_norm(grads)
  # A loss or gradient norm that is not finite leaves the state as it came (`nonfinite`).
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)

  def apply():
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state

  params, opt_state = jax.lax.cond(finite, apply, lambda: (state.params, state.opt_state))
  n_tok = jnp.maximum(sums.pop("tokens"), 1.0)
  seq_counts = {k: sums.pop(k) for k in ("seq_masked", "sequences") if k in sums}
  if "routing_differ" in sums:  # share of (token, sparse layer) routed unlike the sampler
    differ, checked = sums.pop("routing_differ"), sums.pop("routing_checked")
    metrics_routes = {"routing_mismatch": differ / jnp.maximum(checked, 1.0)}
  else:
    metrics_routes = {}
  if "expert_tokens" in sums:  # [S, E]: the busiest expert's load over the mean, per layer
    load = sums.pop("expert_tokens")
    ratio = jnp.max(load, -1) / jnp.maximum(jnp.mean(load, -1), 1e-9)
    metrics_moe = {
      "expert_load_max_mean": jnp.mean(ratio),
      "expert_load_max_mean_worst": jnp.max(ratio),
    }
  else:
    metrics_moe = {}
  metrics = {k: (v if k in ("loss", "pg_loss") else v / n_tok) for k, v in sums.items()}
  if seq_counts:
    metrics["seq_masked_frac"] = seq_counts["seq_masked"] / jnp.maximum(seq_counts["sequences"], 1)
  metrics.update(metrics_moe, **metrics_routes)
  metrics.update(ext, grad_norm=grad_norm, tokens=n_tok, lr=learning_rate_schedule(cfg)(state.step))
  metrics[nonfinite.LEAF] = bad_leaf
  new_state = state.replace(
    params=params,
    opt_state=opt_state,
    step=jnp.where(finite, state.step + 1, state.step),
    rng=jnp.where(finite, jax.random.fold_in(state.rng, state.step), state.rng),
  )
  return new_state, metrics


def jit_train_step(model_cfg: ModelConfig, cfg: LearnerConfig, mesh, batch, rules=None):
  """`train_step` jitted for batches shaped like `batch` (arrays or ShapeDtypeStructs):
  state by the logical rules, batch split over the data-parallel axes, metrics
  replicated, state donated. `.lower(...)` it to inspect a plan without running."""
  state_sh = state_shardings(model_cfg, cfg, mesh, rules)
  batch_sh = jax.tree.map(lambda x: sharding.batch_sharding(mesh, x.ndim, rules), batch)
  step = functools.partial(
    train_step, model_cfg=model_cfg, cfg=cfg, tx=make_optimizer(cfg), mesh=mesh
  )
  return jax.jit(
    step,
    in_shardings=(state_sh, batch_sh),
    out_shardings=(state_sh, sharding.replicated(mesh)),
    donate_argnums=0,
  )


def _budget_bytes(cfg: LearnerConfig, mesh, argument_bytes: int) -> float:
  """What the update's temporaries may take (`LearnerConfig.micro_memory_gb`)."""
  if cfg.micro_memory_gb:
    return cfg.micro_memory_gb * 2**30
  device = mesh.devices.flat[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if not stats or "bytes_limit" not in stats:
    return 2.0 * 2**30
  return 0.75 * max(stats["bytes_limit"] - argument_bytes, 0)


def compile_fitting(model_cfg: ModelConfig, cfg: LearnerConfig, mesh, state, batch, rules=None):
  """(jitted step, micro-batch count) for batches shaped like `batch`: the count cfg sets,
  or (`cfg.auto_micro`) the fewest micro-batches whose temporaries the compiler plans within
  `_budget_bytes`, each a whole share of every device's rows. Tried from 1 up, the next try
  scaled by how far the last plan was over."""
  if not cfg.auto_micro:
    step = jit_train_step(model_cfg, cfg, mesh, batch, rules)
    return step, cfg.micro_count(batch.tokens_bt.shape[0])
  rows = batch.tokens_bt.shape[0]
  local = sharding.batch_sharding(mesh, 1, rules).shard_shape((rows,))[0]
  counts = [m for m in range(1, local + 1) if local % m == 0]
  m = 1
  while True:
    step = jit_train_step(model_cfg, dataclasses.replace(cfg, micro_batches=m), mesh, batch, rules)
    plan = step.lower(state, batch).compile().memory_analysis()
    if plan is None or m == counts[-1]:
      return step, m
    over = plan.temp_size_in_bytes / _budget_bytes(cfg, mesh, plan.argument_size_in_bytes)
    if over <= 1:
      return step, m  # jitted: it takes the state and batch as they come, as an explicit count
    m = next(c for c in counts if c >= min(max(2 * m, math.ceil(m * over)), local))


def make_update_fn(model_cfg: ModelConfig, cfg: LearnerConfig, mesh, rules=None):
  """`update(state, batch) -> (state, metrics)`, compiled once per batch layout and shape
  (`compile_fitting`: with `cfg.auto_micro`, split into as many micro-batches as the
  memory budget needs). Its metrics add `micro_batches`, the count it used."""
  compiled: dict = {}

  def update(state: TrainState, batch: TrainBatch):
    key = (jax.tree.structure(batch), tuple(x.shape for x in jax.tree.leaves(batch)))
    if key not in compiled:
      step, m = compile_fitting(model_cfg, cfg, mesh, state, batch, rules)
      compiled[key] = step, m
    step, m = compiled[key]
    state, metrics = step(state, batch)
    return state, dict(metrics, micro_batches=m)

  return update
