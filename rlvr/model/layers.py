"""The Flax modules of one decoder layer: `dense` (the matmul every layer takes), `param`
(a parameter with logical axis names), `RMSNorm`, `Attention` (RoPE, then the kernels of
`rlvr.model.attention`, with or without a KV cache), `MLP`, `MoE` (router + experts of
`rlvr.model.moe`) and `Block`, the pre-norm residual block that `rlvr.model.decoder` stacks.

Masking follows segment ids: tokens attend to earlier tokens of the same non-zero segment;
segment 0 is padding and is never attended to.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlvr.model import attention, lowp, moe
from rlvr.model.config import ModelConfig
from rlvr.model.rope import apply_rope, rope_frequencies
from rlvr.parallel import sharding


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


def adapted_dense(module: nn.Module, name: str, x, w):
  """`dense(x, w)` for the kernel `name` of `module`, plus (x @ A) @ B when the "lora"
  collection holds an adapter for it: A [*in, r], B [r, *out], B already scaled by
  alpha / rank (`rlvr.model.lora.unmerged`). The base kernel is used as it is: no merged
  copy, and its gradient is never formed when only the adapters are trained."""
  y = dense(x, w)
  if module.has_variable("lora", name):
    ab = module.get_variable("lora", name)
    a, b = ab["lora_a"], ab["lora_b"]
    y = y + dense(dense(x, a.reshape(-1, a.shape[-1]).astype(x.dtype)), b.astype(x.dtype))
  return y


def param(module: nn.Module, name: str, shape, axes, dtype, init=None):
  init = init or nn.initializers.normal(0.02)
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class RMSNorm(nn.Module):
  eps: float
  axis_name: str = "embed"
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = param(
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
      w = param(self, f"{name}_kernel", (d, heads, hd), ("embed", head_axis, "head_dim"), pd)
      y = adapted_dense(self, f"{name}_kernel", x_btd, w.astype(dt))
      if c.qkv_bias:
        b = param(
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
    wo = param(self, "o_kernel", (h, hd, d), ("heads", "head_dim", "embed"), pd)
    return adapted_dense(self, "o_kernel", out, wo.reshape(h * hd, d).astype(dt)), kv


class MLP(nn.Module):
  config: ModelConfig
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    c, pd, dt = self.config, self.param_dtype, x.dtype
    wg = param(self, "gate_kernel", (c.hidden_size, c.intermediate_size), ("embed", "mlp"), pd)
    wu = param(self, "up_kernel", (c.hidden_size, c.intermediate_size), ("embed", "mlp"), pd)
    wd = param(self, "down_kernel", (c.intermediate_size, c.hidden_size), ("mlp", "embed"), pd)
    gate = adapted_dense(self, "gate_kernel", x, wg.astype(dt))
    up = adapted_dense(self, "up_kernel", x, wu.astype(dt))
    return adapted_dense(self, "down_kernel", nn.silu(gate) * up, wd.astype(dt))


class MoE(nn.Module):
  """Router + experts (`rlvr.model.moe`); returns (y, (router logits, chosen experts))."""

  config: ModelConfig
  param_dtype: Any
  mesh: Any = None

  @nn.compact
  def __call__(self, x_btd, routes_btk=None):
    c, pd, dt = self.config, self.param_dtype, x_btd.dtype
    e, d, f = c.num_experts, c.hidden_size, c.moe_intermediate_size
    wr = param(self, "router_kernel", (d, e), ("embed", None), pd)
    logits = dense(x_btd, wr.astype(dt)).astype(jnp.float32)
    weights, experts = moe.route(logits, c.num_experts_per_tok, c.norm_topk_prob, routes_btk)
    in_axes, out_axes = ("experts", "embed", "expert_mlp"), ("experts", "expert_mlp", "embed")
    wg = param(self, "gate_kernel", (e, d, f), in_axes, pd)
    wu = param(self, "up_kernel", (e, d, f), in_axes, pd)
    wd = param(self, "down_kernel", (e, f, d), out_axes, pd)
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
