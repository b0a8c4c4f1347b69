"""A layer scan whose backward pass adds each layer's gradient into an accumulator in place.

Gradient accumulation over micro-batches normally holds two full gradients: the running
sum, and the gradient of the micro-batch being added to it, which the layer scan's
backward writes whole before the addition. `scan(fn, params, acc, x, xs)` runs like
`lax.scan` over stacked layer parameters, but its custom backward pass is a reverse scan
that recomputes each layer (as a fully rematerialised layer does), takes its vector-Jacobian
product, and adds the layer's parameter gradient into `acc` at that layer's slice: only one
layer's gradient exists at a time, beside the accumulator. The cotangent it returns for
`params` is `acc` plus this pass's gradient, so `jax.grad` of a loss built on it returns
the updated running sum, the same numbers as `acc + grad` (Megatron calls this
gradient-accumulation fusion).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


def _pack(a: jax.Array) -> jax.Array:
  """The saved layer inputs, 16-bit floats as uint16: XLA's CPU backend widens a bf16
  array a loop slices to f32 for the whole loop (a copy at twice the stack's size, live
  through the backward pass); integers it slices as they are. A no-op elsewhere."""
  if a.dtype.itemsize == 2:
    return jax.lax.bitcast_convert_type(a, jnp.uint16)
  return a


def _unpack(a: jax.Array, dtype) -> jax.Array:
  return jax.lax.bitcast_convert_type(a, dtype) if a.dtype == jnp.uint16 else a


def scan(
  fn: Callable[[Any, jax.Array, Any, Any], tuple[jax.Array, Any]],
  params: Any,
  acc: Any,
  x: jax.Array,
  xs: Any,
  consts: Any = (),
) -> tuple[jax.Array, Any]:
  """`(x_last, ys)` of `x_{i+1}, y_i = fn(params[i], x_i, xs[i], consts)` over the layers.

  params: pytree of arrays stacked on a leading layer axis; acc: a pytree like it (the
  running gradient sum), which the backward pass updates slice by slice and returns as
  params' cotangent; xs: per-layer inputs (stacked, may be integers or None); consts:
  inputs every layer sees (positions, segment ids: not differentiated). The forward pass
  keeps each layer's input `x_i` for the backward pass, nothing else.
  """

  def forward(params, x, xs, consts, keep: bool):
    def body(h, inp):
      p, xi = inp
      h_next, y = fn(p, h, xi, consts)
      return h_next, ((y, _pack(h)) if keep else y)

    return jax.lax.scan(body, x, (params, xs))

  @jax.custom_vjp
  def run(params, acc, x, xs, consts):
    del acc
    return forward(params, x, xs, consts, keep=False)

  def run_fwd(params, acc, x, xs, consts):
    x_last, (ys, inputs) = forward(params, x, xs, consts, keep=True)
    return (x_last, ys), (params, acc, inputs, xs, consts)

  def run_bwd(res, cts):
    params, acc, inputs, xs, consts = res
    ct_x, ct_ys = cts
    x_dtype = ct_x.dtype
    count = jax.tree.leaves(params)[0].shape[0]
    # Integer outputs (chosen experts) have float0 cotangents: rebuilt per layer, not scanned.
    ct_leaves, ct_def = jax.tree.flatten(ct_ys)
    is_int = [c.dtype == jax.dtypes.float0 for c in ct_leaves]
    scanned = [None if z else c for c, z in zip(ct_leaves, is_int)]

    def body(carry, inp):
      ct_h, acc = carry
      i, h, xi, ct_y = inp
      p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False), params)
      h = _unpack(h, x_dtype)
      _, vjp = jax.vjp(lambda p, h: fn(p, h, xi, consts), p, h)
      ct_y = [
        np.zeros(c.shape[1:], jax.dtypes.float0) if z else s
        for c, z, s in zip(ct_leaves, is_int, ct_y)
      ]
      dp, ct_h = vjp((ct_h, ct_def.unflatten(ct_y)))
      acc = jax.tree.map(
        lambda a, d: jax.lax.dynamic_update_index_in_dim(
          a, jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False) + d.astype(a.dtype), i, 0
        ),
        acc,
        dp,
      )
      return (ct_h, acc), None

    (ct_x0, acc), _ = jax.lax.scan(
      body, (ct_x, acc), (jnp.arange(count), inputs, xs, scanned), reverse=True
    )
    return acc, None, ct_x0, None, None

  run.defvjp(run_fwd, run_bwd)
  return run(params, acc, x, xs, consts)
