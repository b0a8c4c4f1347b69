"""Log-prob passes of the policy over a `TrainBatch`: target-aligned token logprobs and
entropies (with the routing of a mixture of experts), the loss masks, and the batched
pass that fixes old logprobs one micro-batch at a time (`make_logprob_fn`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlvr import objectives
from rlvr.learner.config import DTYPES, LearnerConfig, TrainBatch
from rlvr.model import decoder, lora, lowp
from rlvr.model.config import ModelConfig
from rlvr.parallel import sharding


def sequence_logprobs(
  params, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None
):
  """(logp_bt, entropy_bt) of the batch's tokens under `params` (a params pytree, or
  `lora.Adapted`: adapters applied beside the frozen base), target-aligned; with
  `batch.loss_positions_bk`, at those positions only (0 elsewhere).

  mesh: the learner's; a mixture of experts then runs its experts per device
  (expert-parallel over an "expert" axis, `model.forward`)."""
  return sequence_logprobs_routing(params, batch, model_cfg, cfg, mesh)[:2]


def sequence_logprobs_routing(
  params, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None, acc=None
):
  """(logp_bt, entropy_bt, routing): `sequence_logprobs` plus what the routers of a
  mixture of experts did (`decoder.Routing`; None for a dense model). acc: a running
  gradient sum the layers' backward pass adds into (`model.forward(accumulate=)`)."""
  params, adapters = lora.unmerged(params)  # lora.Adapted: the base and its adapters apart
  moe = model_cfg.is_moe
  routes = None
  if moe and cfg.routing_replay and batch.routes_bt is not None:
    routes = jnp.moveaxis(batch.routes_bt, 2, 0)  # [S, B, T, k]
  dtype = DTYPES[cfg.compute_dtype]
  out = decoder.forward(
    params,
    batch.tokens_bt,
    config=model_cfg,
    segment_ids=batch.segment_bt,
    positions=batch.positions_bt,
    remat=cfg.remat,
    return_hidden=True,
    attention_impl=cfg.attention,
    remat_policy=cfg.remat_policy,
    scan_layers=cfg.scan_layers,
    mesh=mesh,
    return_routing=moe,
    routes=routes,
    dtype=dtype,
    accumulate=acc,
    lora=adapters,
  )
  hidden, routing = out if moe else (out, None)
  head = params["embedding"].T if model_cfg.tie_word_embeddings else params["lm_head"]
  head = head.astype(dtype)
  rows, vocab = batch.tokens_bt.shape[0], head.shape[-1]
  chunk = min(cfg.logits_chunk, max(1, (cfg.logits_block_mb << 20) // (4 * rows * vocab)))
  if batch.loss_positions_bk is not None:  # the LM head at the loss tokens only
    logp, entropy = objectives.positions_logprobs_and_entropy(
      hidden, head, batch.tokens_bt, batch.loss_positions_bk, chunk, lowp.logits_matmul
    )
  else:
    logp, entropy = objectives.token_logprobs_and_entropy(
      hidden, head, batch.tokens_bt, chunk, lowp.logits_matmul
    )
  return logp, entropy, routing


def completion_mask(batch: TrainBatch) -> jax.Array:
  """True on the completion tokens of real sequences: every token the loss may count."""
  return batch.loss_mask_bt.astype(bool) & batch.segment_bt.astype(bool)


def loss_mask(batch: TrainBatch, cfg: LearnerConfig) -> jax.Array:
  """The tokens in the loss: `completion_mask`, less length-truncated completions
  with cfg.mask_truncated."""
  mask = completion_mask(batch)
  if cfg.mask_truncated and batch.truncated is not None:
    mask = mask & ~objectives.by_token(batch.truncated.astype(bool))
  return mask


def split_micro(batch: TrainBatch, m: int) -> TrainBatch:
  """[B, ...] -> [m, B/m, ...], strided so each device's rows spread over micro-batches."""

  def split(x):
    if x.shape[0] % m:
      raise ValueError(f"batch size {x.shape[0]} not divisible by micro_batches={m}")
    return x.reshape((x.shape[0] // m, m) + x.shape[1:]).swapaxes(0, 1)

  return jax.tree.map(split, batch)


def batch_logprobs(
  params, batch: TrainBatch, *, model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None
):
  """logp_bt of the whole batch, one micro-batch at a time (`cfg.micro_count`, as the
  update splits it), so that fixing old logprobs needs no more activation memory than
  a training micro-batch."""
  micro = split_micro(batch, cfg.micro_count(batch.tokens_bt.shape[0]))
  logp = jax.lax.map(lambda mb: sequence_logprobs(params, mb, model_cfg, cfg, mesh)[0], micro)
  return logp.swapaxes(0, 1).reshape(batch.tokens_bt.shape)  # undo the strided split


def make_logprob_fn(model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None, rules=None):
  """Jitted `(params, batch) -> logp_bt` (`batch_logprobs`), e.g. to fix old logprobs
  before several steps. params: the policy's weights (`policy_weights(state)`);
  mesh: the learner's (a mixture of experts runs expert-parallel on it); the log-probs
  come back split over its data-parallel axes, as the update takes its batch."""
  fn = functools.partial(batch_logprobs, model_cfg=model_cfg, cfg=cfg, mesh=mesh)
  if mesh is None:
    return jax.jit(fn)
  return jax.jit(fn, out_shardings=sharding.batch_sharding(mesh, 2, rules))
