"""LoRA adapters for the decoder: beside the frozen base in training, merged for export.

A targeted kernel W is read as the matrix [in, out] it applies (`layers.dense`
contracts its leading "in" dims with x): q/k/v [embed | heads, head_dim], o
[heads, head_dim | embed], gate/up [embed | mlp], down [mlp | embed], lm_head
[embed | vocab], embedding [vocab | embed] (a one-hot lookup). Layer kernels
keep their leading "layers" axis. MoE experts are not adapted (their kernels are
skipped by every pattern): a sparse model's adapters sit on its attention and on any
dense MLP layers. The adapter of W is

  A: [layers, *in, rank]   uniform +-1/sqrt(prod(in))   (PEFT's kaiming-uniform)
  B: [layers, rank, *out]  zeros
  W' = W + (alpha / rank) * (A @ B)   with A, B flattened to [in, rank], [rank, out]

so fresh adapters leave the model exactly as it is, and A and B keep W's logical
axes on their in/out dims (they shard like W; the rank dim is replicated).

Training (`LearnerConfig.lora`, `rlvr.learner`): the trainable pytree, and so
the optimizer state, is the adapters only; the frozen base rides in the TrainState.
Each micro-batch's loss runs the forward on `Adapted(base, adapters)`: the layer
stacks' adapters stay apart from W (`unmerged`: every adapted projection computes
x @ W + x @ A @ (s B) inside its layer), so no merged copy of W and no full-size
gradient of W is ever formed; only an adapted embedding or LM head is merged (one
matrix each). Samplers and the export take the merged weights (`merge`).

Dropout: PEFT drops elements of the LoRA path's input, independently per token.
Here dropout zeroes rows of A (input
features of the LoRA path), scaled by 1/(1-p), with one mask per kernel and
layer per optimizer step: (x * m) @ A == x @ (diag(m) A). Same expectation as
PEFT's, but every token of the step shares the mask, so it is a coarser
(feature-level, per-step) regulariser, and 1 or k micro-batches take the same step.
The base path is never dropped.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.sharding import PartitionSpec

from rlvr.model import decoder
from rlvr.model.config import ModelConfig
from rlvr.parallel import sharding

# Parameter name -> how many of its dims (after "layers") are the input dims.
IN_DIMS = {
  "q_kernel": 1,
  "k_kernel": 1,
  "v_kernel": 1,
  "o_kernel": 2,
  "gate_kernel": 1,
  "up_kernel": 1,
  "down_kernel": 1,
  "lm_head": 1,
  "embedding": 1,
}
ALL_LINEAR = (
  "q_kernel",
  "k_kernel",
  "v_kernel",
  "o_kernel",
  "gate_kernel",
  "up_kernel",
  "down_kernel",
)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank 0 = off (full fine-tuning). Defaults with rank=32 are QbQ's M0 recipe
  (alpha 64, dropout 0.05, every linear layer of the blocks)."""

  rank: int = 0
  alpha: float = 64.0
  dropout: float = 0.05
  targets: tuple[str, ...] = ALL_LINEAR  # fnmatch patterns over IN_DIMS' names
  init_from: str = ""  # a PEFT adapter directory to start from (rlvr.model.peft_io); "" = fresh

  def __post_init__(self):
    if isinstance(self.targets, str):
      raise ValueError(f"targets: expected a tuple of names, got the string {self.targets!r}")
    object.__setattr__(self, "targets", tuple(self.targets))
    if not isinstance(self.rank, int) or self.rank < 0:
      raise ValueError(f"rank: must be an int >= 0 (0 = off), got {self.rank!r}")
    if not self.alpha > 0:
      raise ValueError(f"alpha: must be > 0, got {self.alpha!r}")
    if not 0 <= self.dropout < 1:
      raise ValueError(f"dropout: must be in [0, 1), got {self.dropout!r}")
    if not self.targets:
      raise ValueError("targets: empty; name at least one kernel")
    for pattern in self.targets:
      if not any(fnmatch.fnmatchcase(n, pattern) for n in IN_DIMS):
        raise ValueError(
          f"targets: {pattern!r} matches no adaptable parameter; known: {sorted(IN_DIMS)}"
        )

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _layout(path: tuple[str, ...]) -> tuple[int, int]:
  """(leading stacked dims, input dims) of the kernel at `path`."""
  return (1 if path[0].startswith("layers") else 0), IN_DIMS[path[-1]]


def _targeted(params, cfg: LoraConfig) -> list[tuple[str, ...]]:
  """Sorted paths of the kernels `cfg.targets` selects; a pattern that selects none is an error."""
  paths = sorted(traverse_util.flatten_dict(params))
  chosen = []
  for pattern in cfg.targets:
    hits = [
      p
      for p in paths
      if p[-1] in IN_DIMS and "moe" not in p and fnmatch.fnmatchcase(p[-1], pattern)
    ]
    if not hits:
      experts = any(p[-1] in IN_DIMS and fnmatch.fnmatchcase(p[-1], pattern) for p in paths)
      raise ValueError(
        f"targets: {pattern!r} matches "
        + (
          "only mixture-of-experts kernels, which are not adapted (name the attention ones)"
          if experts
          else "no parameter of this model (e.g. lm_head of a tied model)"
        )
      )
    chosen += [p for p in hits if p not in chosen]
  return sorted(chosen)


def init_adapters(params, cfg: LoraConfig, rng: jax.Array):
  """{kernel path: {"lora_a": A, "lora_b": B}} (f32) for every targeted kernel; B = 0."""
  flat = traverse_util.flatten_dict(params)
  out = {}
  for i, path in enumerate(_targeted(params, cfg)):
    shape = flat[path].shape
    lead, n_in = _layout(path)
    bound = 1.0 / math.sqrt(math.prod(shape[lead : lead + n_in]))
    out[path + ("lora_a",)] = jax.random.uniform(
      jax.random.fold_in(rng, i), shape[: lead + n_in] + (cfg.rank,), jnp.float32, -bound, bound
    )
    out[path + ("lora_b",)] = jnp.zeros(
      shape[:lead] + (cfg.rank,) + shape[lead + n_in :], jnp.float32
    )
  return traverse_util.unflatten_dict(out)


def delta(a: jax.Array, b: jax.Array, lead: int, scale: float) -> jax.Array:
  """scale * A @ B over the flattened in/out dims, shaped [*lead, *in, *out]."""
  r = a.shape[-1]
  batch = a.shape[:lead]
  a2 = a.reshape(batch + (-1, r))
  b2 = b.reshape(batch + (r, -1))
  d = jnp.matmul(a2, b2, precision=jax.lax.Precision.HIGHEST) * scale
  return d.reshape(a.shape[:-1] + b.shape[lead + 1 :])


def drop(adapters, cfg: LoraConfig, dropout_rng: jax.Array | None):
  """`adapters` with rows of A dropped (each kept one scaled by 1/(1-p)), one mask per
  kernel (its index in sorted order) and layer; unchanged without a key or dropout."""
  if dropout_rng is None or cfg.dropout <= 0:
    return adapters
  flat = dict(traverse_util.flatten_dict(adapters))
  for i, path in enumerate(sorted({p[:-1] for p in flat})):
    a = flat[path + ("lora_a",)]
    keep = jax.random.bernoulli(jax.random.fold_in(dropout_rng, i), 1 - cfg.dropout, a.shape[:-1])
    flat[path + ("lora_a",)] = a * (keep[..., None] / (1 - cfg.dropout)).astype(a.dtype)
  return traverse_util.unflatten_dict(flat)


def merge(params, adapters, cfg: LoraConfig, dropout_rng: jax.Array | None = None):
  """params with every adapted kernel W replaced by W + (alpha/rank) A @ B (pure, jittable).

  With `dropout_rng` and cfg.dropout > 0, rows of A are dropped first (`drop`).
  The sum is taken in f32 and cast back to W's dtype.
  """
  flat = dict(traverse_util.flatten_dict(params))
  ad = traverse_util.flatten_dict(drop(adapters, cfg, dropout_rng))
  for path in sorted({p[:-1] for p in ad}):
    a, b = ad[path + ("lora_a",)], ad[path + ("lora_b",)]
    lead, _ = _layout(path)
    w = flat[path]
    flat[path] = (w.astype(jnp.float32) + delta(a, b, lead, cfg.scale)).astype(w.dtype)
  return traverse_util.unflatten_dict(flat)


@flax.struct.dataclass
class Adapted:
  """A policy held as LoRA adapters on a frozen base (a pytree: it passes through jit).

  What the learner hands a sampler: one that serves adapters (vLLM with LoRA enabled)
  pushes `adapters` only, any other takes `merged()`. The learner's forward passes take it
  too (`unmerged`): the base is never copied."""

  base: Any
  adapters: Any
  cfg: LoraConfig = flax.struct.field(pytree_node=False)

  def merged(self):
    return _merge_jit(self.base, self.adapters, self.cfg)


_merge_jit = jax.jit(lambda base, adapters, cfg: merge(base, adapters, cfg), static_argnums=2)


def as_params(weights):
  """The policy's full weights, whether `weights` is a params pytree or `Adapted`."""
  return weights.merged() if isinstance(weights, Adapted) else weights


def unmerged(weights):
  """(params, layer adapters or None) for `decoder.forward(params, ..., lora=...)`.

  Adapters of the layer stacks stay apart: each adapted projection adds x @ A @ (s B) to
  x @ W inside the layer (`layers.dense_lora`), so neither a merged copy of W nor W's
  full-size gradient ever exists. The embedding and LM head, when adapted, are merged
  (one matrix each). A params pytree comes back as is, with None."""
  if not isinstance(weights, Adapted):
    return weights, None
  flat = traverse_util.flatten_dict(weights.adapters)
  stacked = {p: x for p, x in flat.items() if p[0].startswith("layers")}
  top = {p: x for p, x in flat.items() if not p[0].startswith("layers")}
  params = weights.base
  if top:
    params = merge(params, traverse_util.unflatten_dict(top), weights.cfg)
  layer = {p: (x * weights.cfg.scale if p[-1] == "lora_b" else x) for p, x in stacked.items()}
  return params, (traverse_util.unflatten_dict(layer) if layer else None)


# ------------------------------------------------------------------ shardings
def adapter_shapes(model_cfg: ModelConfig, cfg: LoraConfig):
  """ShapeDtypeStruct pytree of the adapters, without allocating them."""
  return jax.eval_shape(
    lambda: init_adapters(decoder.param_shapes(model_cfg), cfg, jax.random.PRNGKey(0))
  )


def logical_axes(model_cfg: ModelConfig, cfg: LoraConfig):
  """PartitionSpec of logical names per adapter: W's names on the in/out dims, rank unnamed."""
  kernel_axes = traverse_util.flatten_dict(decoder.logical_axes(model_cfg))
  out = {}
  for path in traverse_util.flatten_dict(adapter_shapes(model_cfg, cfg)):
    kernel = path[:-1]
    names = tuple(kernel_axes[kernel])
    lead, n_in = _layout(kernel)
    if path[-1] == "lora_a":
      out[path] = PartitionSpec(*names[: lead + n_in], None)
    else:
      out[path] = PartitionSpec(*names[:lead], None, *names[lead + n_in :])
  return traverse_util.unflatten_dict(out)


def shardings(model_cfg: ModelConfig, cfg: LoraConfig, mesh, rules=None):
  """NamedSharding pytree of the adapters under the logical `rules`."""
  return sharding.tree_shardings(
    logical_axes(model_cfg, cfg), adapter_shapes(model_cfg, cfg), mesh, rules
  )
