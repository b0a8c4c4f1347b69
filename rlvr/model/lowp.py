"""CPU matmuls in bf16 / f16 with f32 accumulation, with custom VJPs laid out for XLA's CPU kernels.

`cpu_low_precision(dtype)` says when they apply (bf16 / f16 on the CPU backend);
`matmul` is the custom-VJP product the decoder's layers take (`layers.dense`),
`logits_matmul` the language-model head's (f32 logits, the gradient rounded to the
activations' dtype, as autocast does), which the learner's chunked loss takes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def cpu_low_precision(dtype) -> bool:
  """True for bf16 / f16 on the CPU backend, where `matmul` replaces a plain matmul."""
  return dtype in (jnp.bfloat16, jnp.float16) and jax.default_backend() == "cpu"


def _acc32(a, b, contract):
  return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def _materialized_t(x):
  """x.T [n, m] -> [m, n] as a real copy. A plain transpose is folded into the dot's
  operand layout, and XLA's CPU dot with the contraction on the leading axis of both
  operands (the weight gradient x^T g) runs ~4x slower in bf16 than the copy plus a
  row-major dot. Splitting rows first keeps the copy from being folded."""
  n, m = x.shape
  k = next(c for c in (16, 8, 4, 2, 1) if n % c == 0)
  return x.reshape(n // k, k, m).transpose(2, 0, 1).reshape(m, n)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x, w, f32_out: bool = False):
  """[n, d] @ [d, f] in bf16 / f16 with f32 accumulation, backward dots laid out for
  XLA's CPU kernels (AMX / AVX512-BF16 when the CPU has them); same values as
  `x @ w` up to rounding of the f32 sum. f32_out: keep the f32 result (logits); its
  gradient is rounded to x's dtype for the backward dots, as autocast does."""
  y = _acc32(x, w, ((1,), (0,)))
  return y if f32_out else y.astype(x.dtype)


def _matmul_fwd(x, w, f32_out):
  # x^T is the residual: transposing here, on a fresh value, is cheap; transposing
  # in the backward pass would fuse with the read from the layer scan's stack (slow).
  return matmul(x, w, f32_out), (_materialized_t(x), w)


def _matmul_bwd(f32_out, res, g):
  x_t, w = res
  g = g.astype(x_t.dtype)
  dx = _acc32(g, w, ((1,), (1,))).astype(x_t.dtype)  # g @ w^T
  dw = _acc32(x_t, g, ((1,), (0,))).astype(w.dtype)  # x^T @ g
  return dx, dw


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def logits_matmul(x, w):
  """x[n, d] @ w[d, V] -> f32 logits; bf16 / f16 on CPU through `matmul` (the
  backward dots in x's dtype with f32 accumulation, not f32 dots on upcast inputs)."""
  if cpu_low_precision(x.dtype):
    return matmul(x, w.astype(x.dtype), True)
  return jnp.matmul(x, w.astype(x.dtype), preferred_element_type=jnp.float32)
