"""Decoder-only transformer of the Qwen2 / Qwen2.5 / Qwen3 / Llama-3 / Qwen3-MoE family, in Flax.

Layers are stacked with `nn.scan`, so every layer parameter has a leading
"layers" axis and a model of any depth compiles once. Every parameter carries
logical axis names (embed, vocab, heads, kv_heads, head_dim, mlp, layers, experts,
expert_mlp) that `rlvr.parallel.sharding` maps onto mesh axes. A mixture-of-experts model whose
layers are all sparse (or all dense) has one stack, "layers"; one with dense layers among
sparse ones has a stack per run of alike layers, "layers_<first layer>" (`layer_groups`).

Masking follows segment ids: tokens attend to earlier tokens of the same
non-zero segment; segment 0 is padding and is never attended to. With a
`KVCache`, new keys and values are written at `cache.index` and queries see
every filled slot of their segment up to their own slot.

This file holds the cache, the layer stacks, `Decoder` and the functional API (`forward`,
`init`, `param_shapes`, ...); the modules of one layer are in `rlvr.model.layers`, RoPE in
`rlvr.model.rope`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from rlvr.model import grad_accum
from rlvr.model.config import ModelConfig
from rlvr.model.layers import Block, RMSNorm, param
from rlvr.model.lowp import logits_matmul  # noqa: F401 (docs/benchmarks.md: decoder.logits_matmul)
from rlvr.parallel import sharding

Params = Any


@flax.struct.dataclass
class KVCache:
  """Keys/values of all layers for incremental decoding.

  k, v: [layers, batch, slots, kv_heads, head_dim]; segment_bs: [batch, slots]
  (0 = empty or padding); index: next slot to write, shared by the batch.
  """

  k: jax.Array
  v: jax.Array
  segment_bs: jax.Array
  index: jax.Array

  @classmethod
  def empty(cls, config: ModelConfig, batch: int, slots: int, dtype=jnp.float32) -> "KVCache":
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
    return cls(
      k=jnp.zeros(shape, dtype),
      v=jnp.zeros(shape, dtype),
      segment_bs=jnp.zeros((batch, slots), jnp.int32),
      index=jnp.zeros((), jnp.int32),
    )


@flax.struct.dataclass
class Routing:
  """What the routers of the sparse layers did, layer-major over the S sparse layers.

  logits: [S, B, T, E] router logits (f32); experts: [S, B, T, k] int32 chosen experts.
  A dense model has S = E = k = 0: the same pytree with empty arrays.
  """

  logits: jax.Array
  experts: jax.Array


@dataclasses.dataclass(frozen=True)
class LayerGroup:
  """A run of consecutive layers of one kind, stacked under `name`."""

  name: str
  sparse: bool
  start: int
  count: int

  def __contains__(self, layer: int) -> bool:
    return self.start <= layer < self.start + self.count


def layer_groups(config: ModelConfig) -> tuple[LayerGroup, ...]:
  """The parameter stacks: one "layers" when every layer is alike, else one per run."""
  kinds = [config.sparse(i) for i in range(config.num_layers)]
  runs, start = [], 0
  for i in range(1, config.num_layers + 1):
    if i == config.num_layers or kinds[i] != kinds[start]:
      runs.append((kinds[start], start, i - start))
      start = i
  if len(runs) == 1:
    return (LayerGroup("layers", *runs[0]),)
  return tuple(LayerGroup(f"layers_{s}", sparse, s, n) for sparse, s, n in runs)


REMAT_POLICIES = ("nothing", "dots")


def remat_policy(name: str):
  """What a rematerialised layer keeps for the backward pass: "nothing" (only its
  input; everything recomputed) or "dots" (also matmul outputs without batch
  dimensions: less recompute, more memory)."""
  if name == "nothing":
    return jax.checkpoint_policies.nothing_saveable
  if name == "dots":
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  raise ValueError(f"remat_policy: unknown {name!r}; expected one of {REMAT_POLICIES}")


class Decoder(nn.Module):
  config: ModelConfig
  param_dtype: Any = jnp.float32
  remat: bool = False
  attention: str = "auto"
  remat_policy: str = "nothing"
  scan_layers: bool = True
  mesh: Any = None  # experts per device (expert-parallel over an "expert" axis > 1)
  dtype: Any = None  # activations (default: the parameters'); each layer casts its own weights

  @nn.compact
  def __call__(
    self,
    tokens_bt,
    positions_bt,
    segment_bt,
    cache: KVCache | None = None,
    return_hidden: bool = False,
    routes: jax.Array | None = None,
    accumulate: Params | None = None,
  ):
    c, pd = self.config, self.param_dtype
    if accumulate is not None and cache is not None:
      raise ValueError("accumulate: gradient accumulation has no use with a KV cache")
    embed = param(self, "embedding", (c.vocab_size, c.hidden_size), ("vocab", "embed"), pd)
    x = jnp.take(embed, tokens_bt, axis=0)
    if self.dtype is not None:
      x = x.astype(self.dtype)

    block = Block
    if self.remat:
      block = nn.remat(Block, prevent_cse=False, policy=remat_policy(self.remat_policy))

    kv = None
    if cache is not None:
      seg_in_cache = jax.lax.dynamic_update_slice_in_dim(
        cache.segment_bs, segment_bt.astype(jnp.int32), cache.index, axis=1
      )
      kv = (cache.k, cache.v, seg_in_cache, cache.index)
    routed, sparse_seen = [], 0
    for group in layer_groups(c):
      given = None
      if group.sparse and routes is not None:
        given = routes[sparse_seen : sparse_seen + group.count]
      layers = jnp.arange(group.start, group.start + group.count)
      if accumulate is not None and "lora" in self.variables:
        raise ValueError("accumulate: LoRA adapters train without the in-backward accumulator")
      if accumulate is not None and not self.is_initializing():
        # Backward adds each layer's gradient into accumulate[group] in place (grad_accum).
        one = Block(c, pd, self.attention, group.sparse, self.mesh, parent=None)

        def layer(p, h, xi, consts, one=one):
          (h, _), y = one.apply({"params": p}, (h, None), *consts, *xi)
          return h, y

        x, ys = grad_accum.scan(
          layer,
          self.variables["params"][group.name],
          accumulate[group.name],
          x,
          (layers, given),
          (positions_bt, segment_bt),
        )
      elif self.scan_layers or self.is_initializing():
        scanned = nn.scan(
          block,
          variable_axes={"params": 0, "lora": 0},
          split_rngs={"params": True},
          in_axes=(nn.broadcast, nn.broadcast, 0, 0),
          length=group.count,
          metadata_params={nn.PARTITION_NAME: "layers"},
        )(c, pd, self.attention, group.sparse, self.mesh, name=group.name)
        (x, kv), ys = scanned((x, kv), positions_bt, segment_bt, layers, given)
      else:
        # The same stacked parameters, one layer after another in straight-line code: no
        # stacked [layers, ...] residuals written and read back by the scan (on CPU those
        # copies cost as much as the matmuls of a small model); compile time grows with depth.
        stacked = {
          k: v[group.name]
          for k, v in self.variables.items()
          if k in ("params", "lora") and group.name in v
        }
        each = []
        for i in range(group.count):
          (x, kv), y = block(c, pd, self.attention, group.sparse, self.mesh).apply(
            jax.tree.map(lambda a, i=i: a[i], stacked),
            (x, kv),
            positions_bt,
            segment_bt,
            group.start + i,
            None if given is None else given[i],
          )
          each.append(y)
        ys = jax.tree.map(lambda *a: jnp.stack(a), *each) if group.sparse else None
      if group.sparse:
        routed.append(ys)
        sparse_seen += group.count
    new_cache = None
    if cache is not None:
      new_cache = KVCache(
        k=kv[0], v=kv[1], segment_bs=kv[2], index=cache.index + tokens_bt.shape[1]
      )
    if routed:
      routing = Routing(
        logits=jnp.concatenate([r[0] for r in routed]),
        experts=jnp.concatenate([r[1] for r in routed]),
      )
    else:
      b, t = tokens_bt.shape
      routing = Routing(
        logits=jnp.zeros((0, b, t, 0), jnp.float32), experts=jnp.zeros((0, b, t, 0), jnp.int32)
      )

    x = RMSNorm(c.rms_norm_eps, param_dtype=pd, name="final_norm")(x)
    if return_hidden:
      return x, new_cache, routing
    if c.tie_word_embeddings:
      head = embed.T
    else:
      head = param(self, "lm_head", (c.hidden_size, c.vocab_size), ("embed", "vocab"), pd)
    logits = jnp.einsum("btd,dv->btv", x, head.astype(x.dtype), preferred_element_type=jnp.float32)
    return logits, new_cache, routing


# ---------------------------------------------------------------- functional API
def default_positions(segment_bt: jax.Array) -> jax.Array:
  """Positions that count only real (non-zero segment) tokens: left padding safe."""
  return jnp.maximum(jnp.cumsum(segment_bt != 0, axis=-1) - 1, 0).astype(jnp.int32)


def forward(
  params: Params,
  tokens_bt: jax.Array,
  *,
  config: ModelConfig,
  positions: jax.Array | None = None,
  segment_ids: jax.Array | None = None,
  cache: KVCache | None = None,
  remat: bool = False,
  return_hidden: bool = False,
  attention_impl: str = "auto",
  remat_policy: str = "nothing",
  scan_layers: bool = True,
  routes: jax.Array | None = None,
  return_routing: bool = False,
  mesh: jax.sharding.Mesh | None = None,
  dtype=None,
  accumulate: Params | None = None,
  lora: Params | None = None,
):
  """Logits [B,T,V] (f32) of `tokens_bt` [B,T].

  segment_ids: [B,T] ints, 0 for padding (default all ones). positions: [B,T]
  RoPE positions (default: count of real tokens before each one, plus the
  cache's fill when decoding). Activations use the dtype of the parameters.
  With `cache`, returns `(logits, new_cache)`. With `return_hidden`, returns the
  final normed hidden states [B,T,D] instead of logits (for chunked heads).
  attention_impl: "auto" (blockwise from `attention.BLOCKWISE_FROM` positions on,
  never [T, T] logits), "dense", "blockwise" or "cudnn" (`rlvr.model.attention`).
  remat_policy: what each rematerialised layer saves (`REMAT_POLICIES`).
  scan_layers: one `lax.scan` over the stacked layers (compile time independent of
  depth), or False: the layers unrolled (faster for small models on CPU).
  routes: [S, B, T, k] int32 expert ids per sparse layer (routing replay): the sparse
  layers use these experts instead of their top-k (weights still from the router).
  return_routing: also return a `Routing` (router logits and chosen experts of every
  sparse layer; empty arrays for a dense model), last: `(out, routing)` or
  `(out, new_cache, routing)`.
  mesh: the mesh the call runs on: the experts then run per device on its own tokens,
  expert-parallel over an "expert" axis larger than 1 (`rlvr.model.moe.expert_ffn`);
  without it the token-slots are sorted as one global array. Dense models ignore it.
  dtype: the activations' dtype when it is not the parameters' (f32 master weights, bf16
  compute): every layer casts its own slice of the weights inside the layer scan, so no
  low-precision copy of the whole model (nor its gradient) is ever live at once.
  accumulate: a running gradient sum shaped like `params`: the layer stacks then run in
  `grad_accum.scan`, whose backward pass adds each layer's gradient into its slice of
  `accumulate[stack]` in place and returns the sum as the stack's gradient (every layer is
  recomputed in the backward pass, as with remat; `remat` / `remat_policy` are unused).
  lora: LoRA adapters of the layer stacks, shaped as `rlvr.model.lora` makes them with B
  scaled by alpha / rank (`lora.unmerged`): each adapted projection adds x @ A @ B inside
  its layer (`layers.adapted_dense`).
  """
  if segment_ids is None:
    segment_ids = jnp.ones(tokens_bt.shape, jnp.int32)
  if positions is None:
    positions = default_positions(segment_ids)
    if cache is not None:
      prior = jnp.sum(cache.segment_bs != 0, axis=-1, keepdims=True).astype(jnp.int32)
      positions = positions + prior
  if not config.is_moe:
    mesh = None
  out, new_cache, routing = Decoder(
    config,
    remat=remat,
    attention=attention_impl,
    remat_policy=remat_policy,
    scan_layers=scan_layers,
    mesh=mesh,
    dtype=dtype,
  ).apply(
    {"params": params} if lora is None else {"params": params, "lora": lora},
    tokens_bt,
    positions,
    segment_ids,
    cache,
    return_hidden,
    routes,
    accumulate,
  )
  head = (out,) if cache is None else (out, new_cache)
  if return_routing:
    head += (routing,)
  return head[0] if len(head) == 1 else head


def _abstract_init(config: ModelConfig, param_dtype):
  model = Decoder(config, param_dtype=param_dtype)
  tokens = jnp.zeros((1, 1), jnp.int32)
  return functools.partial(model.init, tokens_bt=tokens, positions_bt=tokens, segment_bt=tokens)


def init_boxed(config: ModelConfig, rng: jax.Array, param_dtype=jnp.float32):
  """Parameters wrapped in `nn.LogicallyPartitioned` boxes (use `eval_shape` for shapes)."""
  return _abstract_init(config, param_dtype)(rng)["params"]


def init(config: ModelConfig, rng: jax.Array, param_dtype=jnp.float32) -> Params:
  """Random parameters (normal 0.02, norms at 1, biases at 0)."""
  return nn.unbox(init_boxed(config, rng, param_dtype))


def logical_axes(config: ModelConfig) -> Params:
  """Pytree of logical axis-name tuples matching the parameter tree."""
  boxed = jax.eval_shape(lambda: init_boxed(config, jax.random.key(0)))
  return nn.get_partition_spec(boxed)


def param_shapes(config: ModelConfig, param_dtype=jnp.float32) -> Params:
  """ShapeDtypeStruct pytree of the parameters, without allocating them."""
  return nn.unbox(jax.eval_shape(lambda: init_boxed(config, jax.random.key(0), param_dtype)))


def param_shardings(config: ModelConfig, mesh: jax.sharding.Mesh, rules=None) -> Params:
  """NamedSharding pytree for the parameters under `rules` (default `sharding.DEFAULT_RULES`)."""
  return sharding.tree_shardings(logical_axes(config), param_shapes(config), mesh, rules)


def count_params(config: ModelConfig) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(param_shapes(config)))
