"""The learner's state: `TrainState` / `LoraTrainState`, the AdamW optimizer and its
learning-rate schedule, the state's shardings and its placement on the mesh."""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from rlvr.learner.config import DTYPES, LearnerConfig
from rlvr.model import decoder, peft_io
from rlvr.model import lora as lora_lib
from rlvr.model.config import ModelConfig
from rlvr.parallel import sharding


@flax.struct.dataclass
class TrainState:
  params: Any  # f32 master weights
  opt_state: Any
  step: jax.Array
  rng: jax.Array
  ref_params: Any = None  # frozen reference model, only when kl_beta > 0


@flax.struct.dataclass
class LoraTrainState(TrainState):
  """The state with LoRA: params (and so opt_state) are the adapters, `base` the
  frozen weights they adapt, in the learner's compute dtype (bf16 at paper scale;
  never an f32 copy), which is also the KL reference (adapters off: no second model).
  A subclass, so that full fine-tuning's TrainState and its checkpoints keep their
  structure."""

  base: Any = None
  lora: lora_lib.LoraConfig = flax.struct.field(pytree_node=False, default=None)


# fold_in streams of TrainState.rng (its per-step chain folds in step numbers).
LORA_INIT, LORA_DROPOUT = 0x4C6F5241, 0x4C6F5244


def policy_params(state: TrainState):
  """The policy's weights: `state.params`, or with LoRA the base with the adapters merged."""
  return lora_lib.as_params(policy_weights(state))


def policy_weights(state: TrainState):
  """What a sampler is handed: `state.params`, or with LoRA `lora.Adapted` (a sampler that
  serves adapters pushes those alone; any other merges them)."""
  if not isinstance(state, LoraTrainState):
    return state.params
  return lora_lib.Adapted(state.base, state.params, state.lora)


def reference_params(state: TrainState):
  """The KL reference: `state.ref_params`, or with LoRA the base (adapters off)."""
  return state.base if isinstance(state, LoraTrainState) else state.ref_params


def learning_rate_schedule(cfg: LearnerConfig) -> optax.Schedule:
  if cfg.lr_schedule == "constant":
    if cfg.warmup_steps:
      return optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.constant_schedule(cfg.learning_rate)
  return optax.warmup_cosine_decay_schedule(
    0.0,
    cfg.learning_rate,
    max(cfg.warmup_steps, 1),
    max(cfg.total_steps, cfg.warmup_steps + 1),
    end_value=cfg.learning_rate * cfg.min_lr_ratio,
  )


def make_optimizer(cfg: LearnerConfig) -> optax.GradientTransformation:
  parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
  parts.append(
    optax.adamw(
      learning_rate_schedule(cfg),
      b1=cfg.b1,
      b2=cfg.b2,
      eps=cfg.adam_eps,
      weight_decay=cfg.weight_decay,
    )
  )
  return optax.chain(*parts)


# ------------------------------------------------------------------ shardings
def state_shardings(model_cfg: ModelConfig, cfg: LearnerConfig, mesh, rules=None):
  """TrainState of NamedShardings: params and their optimizer moments by the rules."""
  tx = make_optimizer(cfg)
  model_sh = decoder.param_shardings(model_cfg, mesh, rules)
  lora = bool(cfg.lora.rank)
  if lora:
    param_sh = lora_lib.shardings(model_cfg, cfg.lora, mesh, rules)
    shapes = lora_lib.adapter_shapes(model_cfg, cfg.lora)
  else:
    param_sh, shapes = model_sh, decoder.param_shapes(model_cfg)
  rep = sharding.replicated(mesh)
  opt_sh = optax.tree_map_params(
    tx,
    lambda _, s: s,
    jax.eval_shape(tx.init, shapes),
    param_sh,
    transform_non_params=lambda _: rep,
  )
  kw = dict(
    params=param_sh,
    opt_state=opt_sh,
    step=rep,
    rng=rep,
    ref_params=model_sh if cfg.kl_beta > 0 and not lora else None,
  )
  return LoraTrainState(**kw, base=model_sh, lora=cfg.lora) if lora else TrainState(**kw)


def new_state(params, rng, cfg: LearnerConfig, adapters=None) -> TrainState:
  """Fresh TrainState: f32 master params, zero optimizer moments, step 0. With LoRA:
  the base in the compute dtype (the KL reference too), fresh f32 adapters as params."""
  compute = DTYPES[cfg.compute_dtype]
  if cfg.lora.rank:
    base = jax.tree.map(lambda x: x.astype(compute), params)
    if adapters is None:  # fresh ones; given: loaded to continue training (`init_state`)
      adapters = lora_lib.init_adapters(base, cfg.lora, jax.random.fold_in(rng, LORA_INIT))
    return LoraTrainState(
      params=adapters,
      opt_state=make_optimizer(cfg).init(adapters),
      step=jnp.zeros((), jnp.int32),
      rng=rng,
      base=base,
      lora=cfg.lora,
    )
  params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  ref = None
  if cfg.kl_beta > 0:
    ref = jax.tree.map(lambda x: x.astype(compute), params)
  return TrainState(
    params=params,
    opt_state=make_optimizer(cfg).init(params),
    step=jnp.zeros((), jnp.int32),
    rng=rng,
    ref_params=ref,
  )


def reset_optimizer(state: TrainState) -> TrainState:
  """The same state with fresh optimizer moments and counts (AdamW's init is all zeros),
  placed as before; params and step are kept."""
  return state.replace(opt_state=jax.tree.map(jnp.zeros_like, state.opt_state))


def init_state(
  model_cfg: ModelConfig, cfg: LearnerConfig, params, mesh, rng=None, rules=None
) -> TrainState:
  """Places params (as f32 master) and fresh optimizer state on the mesh.

  rng: a raw uint32 key (`jax.random.PRNGKey`), which orbax checkpoints as is.
  """
  rng = jax.random.PRNGKey(0) if rng is None else rng
  sh = state_shardings(model_cfg, cfg, mesh, rules)
  adapters = load_adapters(model_cfg, cfg.lora) if cfg.lora.rank and cfg.lora.init_from else None
  init = jax.jit(functools.partial(new_state, cfg=cfg), out_shardings=sh)
  return init(params, rng, adapters=adapters)


def load_adapters(model_cfg: ModelConfig, cfg: lora_lib.LoraConfig):
  """The adapters saved at `cfg.init_from` (PEFT layout), which must match `cfg`'s rank,
  alpha and targets."""
  saved, adapters = peft_io.load_adapter(cfg.init_from, model_cfg)
  for field in ("rank", "alpha"):
    if getattr(saved, field) != getattr(cfg, field):
      raise ValueError(
        f"lora.init_from: {cfg.init_from} has {field} {getattr(saved, field)}, "
        f"lora.{field} is {getattr(cfg, field)}"
      )
  want = traverse_util.flatten_dict(lora_lib.adapter_shapes(model_cfg, cfg))
  have = traverse_util.flatten_dict(adapters)
  if set(want) != set(have):
    names = lambda keys: sorted({k[-2] for k in keys})
    raise ValueError(
      f"lora.init_from: {cfg.init_from} adapts {names(have)}, lora.targets select {names(want)}"
    )
  return adapters
