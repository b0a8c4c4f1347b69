"""Decoder-only transformer of the Qwen2 / Qwen2.5 / Qwen3 / Llama-3 / Qwen3-MoE family, in Flax.

Layers are stacked with `nn.scan`, so every layer parameter has a leading
"layers" axis and a model of any depth compiles once. Every parameter carries
logical axis names (embed, vocab, heads, kv_heads, head_dim, mlp, layers, experts,
expert_mlp) that `rlvr.sharding` maps onto mesh axes. A mixture-of-experts model whose
layers are all sparse (or all dense) has one stack, "layers"; one with dense layers among
sparse ones has a stack per run of alike layers, "layers_<first layer>" (`layer_groups`).

Masking follows segment ids: tokens attend to earlier tokens of the same
non-zero segment; segment 0 is padding and is never attended to. With a
`KVCache`, new keys and values are written at `cache.index` and queries see
every filled slot of their segment up to their own slot.
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

from rlvr import sharding
from rlvr.model import attention, grad_accum, lowp, moe
from rlvr.model.config import ModelConfig, RopeScaling
from rlvr.model.lowp import logits_matmul  # noqa: F401 (docs/benchmarks.md: decoder.logits_matmul)

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


# ----------------------------------------------------------------------- RoPE
def rope_frequencies(config: ModelConfig) -> jax.Array:
  """Inverse frequencies theta^(-2i/d), rescaled per Llama-3 when configured."""
  d = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  if config.rope_scaling is not None:
    inv_freq = _llama3_scale(inv_freq, config.rope_scaling)
  return inv_freq


def _llama3_scale(inv_freq: jax.Array, s: RopeScaling) -> jax.Array:
  """Llama-3.1: long wavelengths divided by `factor`, short kept, smooth between."""
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
    s.high_freq_factor - s.low_freq_factor
  )
  smoothed = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
  out = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(middle, smoothed, out)


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotates halves (HF "rotate_half" layout), computed in f32."""
  angles = positions_bt[..., None].astype(jnp.float32) * inv_freq  # [B,T,D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x = x_bthd.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bthd.dtype)


# --------------------------------------------------------------------- layers
def dense(x, w):
  """x[..., d] @ w[d, *out] as one 2-D matmul: XLA's CPU backward of dots with
  several contracting dims (batch and time) runs ~2x slower than the flat form.
  bf16 / f16 on CPU take `lowp.matmul` (f32 accumulation, the fast kernels)."""
  x2, w2 = x.reshape(-1, x.shape[-1]), w.reshape(w.shape[0], -1)
  if lowp.cpu_low_precision(x.dtype):
    y = lowp.matmul(x2, w2)
  else:
    y = x2 @ w2
  return y.reshape(x.shape[:-1] + w.shape[1:])


def _param(module: nn.Module, name: str, shape, axes, dtype, init=None):
  init = init or nn.initializers.normal(0.02)
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class RMSNorm(nn.Module):
  eps: float
  axis_name: str = "embed"
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = _param(
      self, "scale", (x.shape[-1],), (self.axis_name,), self.param_dtype, nn.initializers.ones
    )
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return scale.astype(x.dtype) * xf.astype(x.dtype)


class Attention(nn.Module):
  config: ModelConfig
  param_dtype: Any
  attention: str = "auto"  # rlvr.model.attention.IMPLEMENTATIONS

  @nn.compact
  def __call__(self, x_btd, positions_bt, segment_bt, kv, layer):
    c, pd = self.config, self.param_dtype
    dt = x_btd.dtype
    h, kvh, hd, d = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size

    def proj(name, heads, head_axis):
      w = _param(self, f"{name}_kernel", (d, heads, hd), ("embed", head_axis, "head_dim"), pd)
      y = dense(x_btd, w.astype(dt))
      if c.qkv_bias:
        b = _param(
          self, f"{name}_bias", (heads, hd), (head_axis, "head_dim"), pd, nn.initializers.zeros
        )
        y = y + b.astype(dt)
      return y

    q = proj("q", h, "heads")
    k = proj("k", kvh, "kv_heads")
    v = proj("v", kvh, "kv_heads")
    if c.qk_norm:
      q = RMSNorm(c.rms_norm_eps, "head_dim", pd, name="q_norm")(q)
      k = RMSNorm(c.rms_norm_eps, "head_dim", pd, name="k_norm")(k)
    inv_freq = rope_frequencies(c)
    q = apply_rope(q, positions_bt, inv_freq)
    k = apply_rope(k, positions_bt, inv_freq)

    t = x_btd.shape[1]
    if kv is None:
      chosen = attention.choose(self.attention, t, decoding=False)
      if chosen == "blockwise":
        out = attention.blockwise_attention(q, k, v, segment_bt)
      elif chosen == "cudnn":
        out = attention.fused_attention(q, k, v, segment_bt, "cudnn")
      else:
        out = attention.causal_dense_attention(q, k, v, segment_bt)
    else:
      # The whole stack's cache rides in the scan carry and is updated in place
      # at [layer, :, index]; slicing per layer through scan outputs would copy it.
      k_all, v_all, kv_segment, index = kv
      at = (layer, 0, index, 0, 0)
      k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), at)
      v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), at)
      keys = jax.lax.dynamic_index_in_dim(k_all, layer, 0, keepdims=False)
      values = jax.lax.dynamic_index_in_dim(v_all, layer, 0, keepdims=False)
      kv = (k_all, v_all, kv_segment, index)
      out = attention.dense_attention(
        q, keys, values, segment_bt, kv_segment, index + jnp.arange(t), jnp.arange(keys.shape[1])
      )
    wo = _param(self, "o_kernel", (h, hd, d), ("heads", "head_dim", "embed"), pd)
    return dense(out, wo.reshape(h * hd, d).astype(dt)), kv


class MLP(nn.Module):
  config: ModelConfig
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    c, pd, dt = self.config, self.param_dtype, x.dtype
    wg = _param(self, "gate_kernel", (c.hidden_size, c.intermediate_size), ("embed", "mlp"), pd)
    wu = _param(self, "up_kernel", (c.hidden_size, c.intermediate_size), ("embed", "mlp"), pd)
    wd = _param(self, "down_kernel", (c.intermediate_size, c.hidden_size), ("mlp", "embed"), pd)
    return dense(nn.silu(dense(x, wg.astype(dt))) * dense(x, wu.astype(dt)), wd.astype(dt))


class MoE(nn.Module):
  """Router + experts (`rlvr.model.moe`); returns (y, (router logits, chosen experts))."""

  config: ModelConfig
  param_dtype: Any
  mesh: Any = None

  @nn.compact
  def __call__(self, x_btd, routes_btk=None):
    c, pd, dt = self.config, self.param_dtype, x_btd.dtype
    e, d, f = c.num_experts, c.hidden_size, c.moe_intermediate_size
    wr = _param(self, "router_kernel", (d, e), ("embed", None), pd)
    logits = dense(x_btd, wr.astype(dt)).astype(jnp.float32)
    weights, experts = moe.route(logits, c.num_experts_per_tok, c.norm_topk_prob, routes_btk)
    in_axes, out_axes = ("experts", "embed", "expert_mlp"), ("experts", "expert_mlp", "embed")
    wg = _param(self, "gate_kernel", (e, d, f), in_axes, pd)
    wu = _param(self, "up_kernel", (e, d, f), in_axes, pd)
    wd = _param(self, "down_kernel", (e, f, d), out_axes, pd)
    batch_axes, specs = (), (None, None, None)
    if self.mesh is not None:
      batch_axes = sharding.data_axes(self.mesh, x_btd.shape[0])
      specs = tuple(
        sharding.spec(a, w.shape, self.mesh)
        for a, w in ((in_axes, wg), (in_axes, wu), (out_axes, wd))
      )
    y = moe.expert_ffn(
      x_btd,
      experts,
      weights.astype(dt),
      wg.astype(dt),
      wu.astype(dt),
      wd.astype(dt),
      self.mesh,
      batch_axes,
      specs,
    )
    return y, (logits, experts)


class Block(nn.Module):
  """Pre-norm residual block; the scan body: carry (x, kv cache or None), xs = (layer
  index, given routes or None); ys: (router logits, experts) of a sparse block, else None."""

  config: ModelConfig
  param_dtype: Any
  attention: str = "auto"
  sparse: bool = False
  mesh: Any = None

  @nn.compact
  def __call__(self, carry, positions_bt, segment_bt, layer, routes_btk=None):
    c, pd = self.config, self.param_dtype
    x, kv = carry
    y, kv = Attention(c, pd, self.attention, name="attn")(
      RMSNorm(c.rms_norm_eps, param_dtype=pd, name="input_norm")(x),
      positions_bt,
      segment_bt,
      kv,
      layer,
    )
    x = x + y
    h = RMSNorm(c.rms_norm_eps, param_dtype=pd, name="post_attn_norm")(x)
    routing = None
    if self.sparse:
      y, routing = MoE(c, pd, self.mesh, name="moe")(h, routes_btk)
    else:
      y = MLP(c, pd, name="mlp")(h)
    x = nn.with_logical_constraint(x + y, ("batch", "length", "embed"))
    return (x, kv), routing


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
    embed = _param(self, "embedding", (c.vocab_size, c.hidden_size), ("vocab", "embed"), pd)
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
          variable_axes={"params": 0},
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
        stacked = self.variables["params"][group.name]
        each = []
        for i in range(group.count):
          (x, kv), y = block(c, pd, self.attention, group.sparse, self.mesh).apply(
            {"params": jax.tree.map(lambda a, i=i: a[i], stacked)},
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
      head = _param(self, "lm_head", (c.hidden_size, c.vocab_size), ("embed", "vocab"), pd)
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
    {"params": params},
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
