"""The GRPO learner: TrainState, optimizer and the sharded, jitted update step.

`make_update_fn(...)` returns `update(state, batch) -> (state, metrics)`: it
recomputes the completion-token logprobs, applies the policy loss
`LearnerConfig.policy_loss` names (`grpo.POLICY_LOSSES`) with the optional mismatch
correction (truncated IS per token or sequence, sequence masking), accumulates
gradients over micro-batches with the loss normaliser of the WHOLE batch (so 1 or k
micro-batches give the same step), clips the global gradient norm and takes one AdamW
step. State is donated.

With `LearnerConfig.lora.rank > 0` the trained pytree (`TrainState.params`,
and so the optimizer state) is the LoRA adapters, the frozen base rides in
`LoraTrainState.base`, and the loss sees `lora.merge(base, adapters)`
(`rlvr.lora`); `policy_params(state, cfg)` is the policy's weights either way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlvr import grpo, sharding
from rlvr import lora as lora_lib
from rlvr.lora import LoraConfig
from rlvr.model import attention, decoder, lowp
from rlvr.model import moe as moe_lib
from rlvr.model.config import ModelConfig
from rlvr.packing import pack_rows  # noqa: F401 (rlvr.sft imports it from here)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """Optimiser and loss settings (defaults: SvS's public settings,
  docs/methods.md#grpo-settings)."""

  learning_rate: float = 1e-6
  lr_schedule: str = "constant"  # "constant" | "cosine" (linear warmup, cosine decay)
  warmup_steps: int = 0
  total_steps: int = 1000  # cosine horizon
  min_lr_ratio: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  adam_eps: float = 1e-8
  grad_clip: float = 1.0  # global-norm clip; <= 0 disables
  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: float | None = 3.0
  aggregation: str = "token-mean"
  kl_beta: float = 0.0  # > 0 keeps a frozen reference model
  kl_estimator: str = "k3"
  micro_batches: int = 1
  micro_batch_rows: int = 0  # > 0: rows per micro-batch instead (the count then
  # follows the batch, as packed batches vary in rows)
  remat: bool = False
  remat_policy: str = "nothing"  # with remat: "nothing" saved per layer, or "dots"
  accumulate_in_backward: bool = False  # the layer scan's backward pass adds each layer's
  # gradient into the micro-batch accumulator in place (`model.grad_accum`): one full
  # gradient in memory instead of two; the same sums; every layer is recomputed (as remat)
  compute_dtype: str = "float32"  # params stay f32 (master); forward in this dtype
  mask_truncated: bool = False  # drop length-truncated completions from the loss
  normalize_all: bool = False  # loss normaliser counts masked truncated completions
  # too (QbQ Eq. 2 divides by all m completions)
  policy_loss: str = "grpo"  # "grpo" | "gspo" | "gspo_token" | "cispo" (grpo.POLICY_LOSSES),
  # or "package.module:function" for a loss defined elsewhere
  tis_cap: float | None = None  # truncated IS weight min(exp(old - sampler), C)
  tis_level: str = "token"  # "token": one weight per token; "sequence": the geometric
  # mean of the sequence's token ratios, one weight per sequence
  seq_mask_cap: float | None = None  # M: drop a sequence from the loss when its geometric
  # mean ratio exp(mean_t (old - sampler)) leaves [1/M, M] (logged: seq_masked_frac)
  moe_aux_loss_coef: float = 0.0  # mixture of experts: weight of the load-balancing loss
  # (`moe.load_balance_loss`; Qwen3-MoE's own training used 1e-3); 0: off
  moe_z_loss_coef: float = 0.0  # weight of the router z-loss (`moe.router_z_loss`); 0: off
  routing_replay: bool = False  # the sparse layers use the experts the sampler routed each
  # token to (batch.routes_bt), not their own top-k (R3); the router keeps its gradient
  logits_chunk: int = 256  # positions per logits block in the loss
  attention: str = "auto"  # "auto" (blockwise at long T), "dense", "blockwise",
  # "cudnn" (GPU flash attention, right-padded rows)
  scan_layers: bool = True  # False: layers unrolled (faster on CPU for small
  # models, compile time grows with depth)
  lora: LoraConfig = LoraConfig()  # rank > 0: train LoRA adapters on a frozen base

  def __post_init__(self):
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate: must be > 0, got {self.learning_rate}")
    for name in ("warmup_steps", "total_steps", "weight_decay", "min_lr_ratio", "kl_beta"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
    for name in ("b1", "b2"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name}: must be in [0, 1), got {getattr(self, name)}")
    if not self.adam_eps > 0 or self.logits_chunk < 1:
      raise ValueError(
        f"adam_eps / logits_chunk: must be > 0 / >= 1, got {self.adam_eps} / {self.logits_chunk}"
      )
    if self.lr_schedule not in ("constant", "cosine"):
      raise ValueError(f"lr_schedule: unknown {self.lr_schedule!r}; expected constant|cosine")
    if self.aggregation not in grpo.AGGREGATIONS:
      raise ValueError(f"aggregation: unknown {self.aggregation!r}; expected {grpo.AGGREGATIONS}")
    if self.kl_estimator not in ("k1", "k3"):
      raise ValueError(f"kl_estimator: unknown {self.kl_estimator!r}; expected k1|k3")
    if self.attention not in attention.IMPLEMENTATIONS:
      raise ValueError(
        f"attention: unknown {self.attention!r}; expected one of {attention.IMPLEMENTATIONS}"
      )
    if self.remat_policy not in decoder.REMAT_POLICIES:
      raise ValueError(
        f"remat_policy: unknown {self.remat_policy!r}; expected one of {decoder.REMAT_POLICIES}"
      )
    if self.compute_dtype not in _DTYPES:
      raise ValueError(f"compute_dtype: unknown {self.compute_dtype!r}; expected {list(_DTYPES)}")
    if self.micro_batches < 1 or self.micro_batch_rows < 0:
      raise ValueError(
        f"micro_batches / micro_batch_rows: must be >= 1 / >= 0, got "
        f"{self.micro_batches} / {self.micro_batch_rows}"
      )
    if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
      raise ValueError(f"eps_low/eps_high: bad clip range {self.eps_low}/{self.eps_high}")
    if self.dual_clip is not None and self.dual_clip <= 1:
      raise ValueError(f"dual_clip: must be > 1, got {self.dual_clip}")
    if self.tis_cap is not None and self.tis_cap <= 0:
      raise ValueError(f"tis_cap: must be > 0, got {self.tis_cap}")
    if self.tis_level not in grpo.TIS_LEVELS:
      raise ValueError(f"tis_level: unknown {self.tis_level!r}; expected one of {grpo.TIS_LEVELS}")
    if self.moe_aux_loss_coef < 0 or self.moe_z_loss_coef < 0:
      raise ValueError(
        f"moe_aux_loss_coef / moe_z_loss_coef: must be >= 0, got "
        f"{self.moe_aux_loss_coef} / {self.moe_z_loss_coef}"
      )
    if self.seq_mask_cap is not None and not self.seq_mask_cap > 1:
      raise ValueError(f"seq_mask_cap: must be > 1, got {self.seq_mask_cap}")
    grpo.policy_loss_fn(self.policy_loss)  # a one-line error naming the known losses
    if self.accumulate_in_backward and (
      self.lora.rank or not self.scan_layers or self.remat_policy != "nothing"
    ):
      raise ValueError(
        "accumulate_in_backward: needs the stacked layer scan and full fine-tuning, and "
        "recomputes every layer whole (scan_layers=True, lora.rank=0, remat_policy='nothing'),"
        f" got scan_layers={self.scan_layers}, lora.rank={self.lora.rank}, "
        f"remat_policy={self.remat_policy!r}"
      )
    if not isinstance(self.lora, LoraConfig):
      raise ValueError(f"lora: expected a rlvr.lora.LoraConfig, got {type(self.lora).__name__}")

  def micro_count(self, rows: int) -> int:
    """Micro-batches a batch of `rows` rows is split into."""
    if not self.micro_batch_rows:
      return self.micro_batches
    if rows % self.micro_batch_rows:
      raise ValueError(
        f"micro_batch_rows: a batch of {rows} rows does not split into "
        f"micro-batches of {self.micro_batch_rows}"
      )
    return rows // self.micro_batch_rows


@flax.struct.dataclass
class TrainBatch:
  """One update's data; every field has the batch as leading dimension.

  `*_bt` fields are target-aligned (see `rlvr.grpo`). old_logp_bt None means
  on-policy: the old policy is the current one (ratio 1, gradient flows).
  sampler_logp_bt: the sampler's logprobs, for mismatch metrics and TIS.
  A packed batch (`packing.pack_rows(..., bins=...)`: several sequences per row) has
  segment ids 1, 2, ... within a row, RoPE positions that restart with each
  sequence, and per-token advantages and truncation flags ([B, T] instead of [B]).
  """

  tokens_bt: jax.Array
  segment_bt: jax.Array  # sequence id within the row (1, 2, ...), 0 on padding
  loss_mask_bt: jax.Array  # 1 on completion tokens in the loss
  advantages: jax.Array  # [B], or [B, T] in a packed batch
  old_logp_bt: jax.Array | None = None
  sampler_logp_bt: jax.Array | None = None
  truncated: jax.Array | None = None  # [B], or [B, T] in a packed batch
  positions_bt: jax.Array | None = None  # packed batches; None: counted from segment_bt
  routes_bt: jax.Array | None = None  # mixture of experts: [B, T, S, k] the sampler's
  # experts per input token (-1: none), for routing replay and the mismatch metric

  @property
  def packed(self) -> bool:
    return self.positions_bt is not None

  @property
  def sequences_bt(self) -> jax.Array | None:
    """Sequence ids within each row for per-sequence sums (`grpo.aggregate`): the
    segment ids of a packed batch; None when every row is one sequence."""
    return self.segment_bt if self.packed else None


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
  frozen f32 weights they merge into. A subclass, so that full fine-tuning's
  TrainState and its checkpoints keep their structure."""

  base: Any = None


# fold_in streams of TrainState.rng (its per-step chain folds in step numbers).
_LORA_INIT, _LORA_DROPOUT = 0x4C6F5241, 0x4C6F5244


def policy_params(state: TrainState, cfg: LearnerConfig):
  """The policy's weights: `state.params`, or with LoRA the base with the adapters merged."""
  if not isinstance(state, LoraTrainState):
    return state.params
  return lora_lib.merge(state.base, state.params, cfg.lora)


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
  if cfg.lora.rank:
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
    ref_params=model_sh if cfg.kl_beta > 0 else None,
  )
  return LoraTrainState(**kw, base=model_sh) if cfg.lora.rank else TrainState(**kw)


def new_state(params, rng, cfg: LearnerConfig) -> TrainState:
  """Fresh TrainState: f32 master params (with LoRA: f32 base, fresh adapters as
  params), zero optimizer moments, step 0."""
  params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
  ref = None
  if cfg.kl_beta > 0:
    ref = jax.tree.map(lambda x: x.astype(_DTYPES[cfg.compute_dtype]), params)
  if cfg.lora.rank:
    adapters = lora_lib.init_adapters(params, cfg.lora, jax.random.fold_in(rng, _LORA_INIT))
    return LoraTrainState(
      params=adapters,
      opt_state=make_optimizer(cfg).init(adapters),
      step=jnp.zeros((), jnp.int32),
      rng=rng,
      ref_params=ref,
      base=params,
    )
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
  return jax.jit(functools.partial(new_state, cfg=cfg), out_shardings=sh)(params, rng)


# ------------------------------------------------------------------- the loss
def sequence_logprobs(
  params, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None
):
  """(logp_bt, entropy_bt) of the batch's tokens under `params`, target-aligned.

  mesh: the learner's; a mixture of experts then runs its experts per device
  (expert-parallel over an "expert" axis, `model.forward`)."""
  return sequence_logprobs_routing(params, batch, model_cfg, cfg, mesh)[:2]


def sequence_logprobs_routing(
  params, batch: TrainBatch, model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None, acc=None
):
  """(logp_bt, entropy_bt, routing): `sequence_logprobs` plus what the routers of a
  mixture of experts did (`decoder.Routing`; None for a dense model). acc: a running
  gradient sum the layers' backward pass adds into (`model.forward(accumulate=)`)."""
  moe = model_cfg.is_moe
  routes = None
  if moe and cfg.routing_replay and batch.routes_bt is not None:
    routes = jnp.moveaxis(batch.routes_bt, 2, 0)  # [S, B, T, k]
  dtype = _DTYPES[cfg.compute_dtype]
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
  )
  hidden, routing = out if moe else (out, None)
  head = params["embedding"].T if model_cfg.tie_word_embeddings else params["lm_head"]
  head = head.astype(dtype)
  logp, entropy = grpo.token_logprobs_and_entropy(
    hidden, head, batch.tokens_bt, cfg.logits_chunk, lowp.logits_matmul
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
    mask = mask & ~grpo.by_token(batch.truncated.astype(bool))
  return mask


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
    "entropy": grpo.masked_sum(entropy, mask),
    "logp": grpo.masked_sum(jax.lax.stop_gradient(logp), mask),
  }
  is_weight = None
  if batch.sampler_logp_bt is not None:
    is_weight, mismatch = grpo.truncated_is_weight(
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
      sequences = grpo.loss_normalizer(mask, "seq-mean-token-mean", batch.sequences_bt)
      sums["seq_masked"] = mismatch.pop("seq_masked_frac") * sequences
      sums["sequences"] = sequences
    sums.update({k: v * tokens for k, v in mismatch.items()})
    if cfg.tis_cap is None and cfg.seq_mask_cap is None:
      is_weight = None
  loss, aux = grpo.policy_loss(
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
    kl = grpo.kl_penalty(logp, jax.lax.stop_gradient(ref_logp), cfg.kl_estimator)
    sums["kl"] = grpo.masked_sum(kl, mask)
    loss = loss + cfg.kl_beta * grpo.aggregate(
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


def _split_micro(batch: TrainBatch, m: int) -> TrainBatch:
  """[B, ...] -> [m, B/m, ...], strided so each device's rows spread over micro-batches."""

  def split(x):
    if x.shape[0] % m:
      raise ValueError(f"batch size {x.shape[0]} not divisible by micro_batches={m}")
    return x.reshape((x.shape[0] // m, m) + x.shape[1:]).swapaxes(0, 1)

  return jax.tree.map(split, batch)


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
  jitted for, handed to the model's forward)."""
  counted = completion_mask(batch) if cfg.normalize_all else loss_mask(batch, cfg)
  normalizer = grpo.loss_normalizer(counted, cfg.aggregation, batch.sequences_bt)
  loss_fn = micro_loss
  if cfg.lora.rank:
    # One dropout mask per step, shared by the micro-batches: 1 or k give the same step.
    dropout_rng = jax.random.fold_in(state.rng, _LORA_DROPOUT)

    def loss_fn(adapters, *args):
      return micro_loss(lora_lib.merge(state.base, adapters, cfg.lora, dropout_rng), *args)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  micro = _split_micro(batch, cfg.micro_count(batch.tokens_bt.shape[0]))
  share = 1.0 / micro.tokens_bt.shape[0]

  # With accumulate_in_backward the stacks' gradients come back already summed into grads_acc.
  in_backward = (
    {g.name for g in decoder.layer_groups(model_cfg)} if cfg.accumulate_in_backward else set()
  )

  def body(carry, mb):
    grads_acc, sums_acc, ext_acc = carry
    acc = grads_acc if in_backward else None
    (loss, (sums, ext)), grads = grad_fn(
      state.params, state.ref_params, mb, normalizer, model_cfg, cfg, mesh, share, acc
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
    lambda: loss_fn(state.params, state.ref_params, first, normalizer, model_cfg, cfg, mesh, share)[
      1
    ][0]
  )
  sums0 = {k: jnp.zeros(v.shape, jnp.float32) for k, v in sums_shape.items()}
  sums0["loss"] = jnp.zeros((), jnp.float32)
  ext0 = {"ratio_max": jnp.array(-jnp.inf), "ratio_min": jnp.array(jnp.inf)}
  (grads, sums, ext), _ = jax.lax.scan(body, (zeros, sums0, ext0), micro)

  grad_norm = optax.tree.norm(grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
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
  new_state = state.replace(
    params=params,
    opt_state=opt_state,
    step=state.step + 1,
    rng=jax.random.fold_in(state.rng, state.step),
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


def make_update_fn(model_cfg: ModelConfig, cfg: LearnerConfig, mesh, rules=None):
  """`update(state, batch) -> (state, metrics)`, jitted once per batch layout
  (`jit_train_step`)."""
  compiled: dict = {}

  def update(state: TrainState, batch: TrainBatch):
    key = jax.tree.structure(batch)
    if key not in compiled:
      compiled[key] = jit_train_step(model_cfg, cfg, mesh, batch, rules)
    return compiled[key](state, batch)

  return update


def batch_logprobs(
  params, batch: TrainBatch, *, model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None
):
  """logp_bt of the whole batch, one micro-batch at a time (`cfg.micro_count`, as the
  update splits it), so that fixing old logprobs needs no more activation memory than
  a training micro-batch."""
  micro = _split_micro(batch, cfg.micro_count(batch.tokens_bt.shape[0]))
  logp = jax.lax.map(lambda mb: sequence_logprobs(params, mb, model_cfg, cfg, mesh)[0], micro)
  return logp.swapaxes(0, 1).reshape(batch.tokens_bt.shape)  # undo the strided split


def make_logprob_fn(model_cfg: ModelConfig, cfg: LearnerConfig, mesh=None):
  """Jitted `(params, batch) -> logp_bt` (`batch_logprobs`), e.g. to fix old logprobs
  before several steps. params: the policy's weights (with LoRA: `policy_params(state, cfg)`);
  mesh: the learner's (a mixture of experts runs expert-parallel on it)."""
  return jax.jit(functools.partial(batch_logprobs, model_cfg=model_cfg, cfg=cfg, mesh=mesh))
