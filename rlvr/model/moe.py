"""Mixture-of-experts maths: top-k routing and dropless expert FFNs by grouped matmul.

Every token goes to each of its `k` experts (no capacity factor, nothing dropped), as in
the samplers, so training log-probs see the same computation as sampling. The token-slots
(token, choice) are sorted by expert, the experts' SwiGLU FFNs run as grouped matmuls
(`jax.lax.ragged_dot`: one group of consecutive rows per expert) and the results are
unsorted and summed with the router weights. On CPU, whose `ragged_dot` multiplies every
row by every expert, the grouped matmul is a scan over tiles of rows instead (`swiglu_tiles`).

Given a mesh, `expert_ffn` runs under `shard_map`, so each device sorts only its own
tokens (a sort over the global batch would gather it onto every device). With an
"expert" axis larger than 1, the expert weights live split over that axis: each device
gathers the tokens of its expert-axis peers (`all_gather`), computes the slots routed to
its own experts and the partial sums go back to the tokens' owners (`psum_scatter`). With top-k routing each token
reaches up to k experts, so an all-to-all of token-slots moves (ep - 1) / ep * k rows per
token, the gather (ep - 1) rows: no more for k >= ep, and the shapes stay static without a
receive-buffer bound.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def route(logits_nte, k: int, norm_topk_prob: bool, routes_ntk=None):
  """Router softmax (f32) and top-k: (weights [..., k] f32, experts [..., k] int32).

  routes_ntk: given expert ids (routing replay); their probabilities are used as the
  weights, so the router still gets gradients through them. A token whose given ids are
  -1 keeps its own top-k.
  """
  probs = jax.nn.softmax(logits_nte.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if routes_ntk is not None:  # a token without given routes (-1) keeps its own top-k
    given = routes_ntk.astype(jnp.int32)
    experts = jnp.where(jnp.all(given >= 0, axis=-1, keepdims=True), given, experts)
    weights = jnp.take_along_axis(probs, experts, axis=-1)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


GROUPED = ("ragged", "tiles")


def default_grouped() -> str:
  """ "ragged" (`jax.lax.ragged_dot`) where XLA has a grouped-matmul kernel (GPU, TPU);
  "tiles" on CPU, whose `ragged_dot` is a dense matmul against every expert (E times the
  work, and an [E, rows, d] temporary)."""
  return "ragged" if jax.default_backend() in ("gpu", "tpu", "cuda", "rocm") else "tiles"


def _ragged(x, w, group_sizes):
  return jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=jnp.float32).astype(x.dtype)


def _dot(x, w):
  return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def swiglu_ragged(xs_md, group_sizes, gate_edf, up_edf, down_efd):
  """Expert-sorted rows [M, D] through their experts' SwiGLU FFNs; rows past the groups -> 0."""
  h = jax.nn.silu(_ragged(xs_md, gate_edf, group_sizes)) * _ragged(xs_md, up_edf, group_sizes)
  return _ragged(h, down_efd, group_sizes)


def swiglu_tiles(xs_md, group_sizes, gate_edf, up_edf, down_efd, tile: int = 128):
  """`swiglu_ragged` as a scan over tiles of `tile` rows, each tile inside one expert's
  group (groups padded with zero rows to whole tiles): the same sums, with the memory of
  the rows only. At most M / tile + E tiles."""
  m, d = xs_md.shape
  e = gate_edf.shape[0]
  tile = max(1, min(tile, m))
  tiles = -(-m // tile) + e
  ends = jnp.cumsum(group_sizes)
  padded = (group_sizes + tile - 1) // tile * tile
  padded_ends = jnp.cumsum(padded)
  row = jnp.arange(m)
  group = jnp.searchsorted(ends, row, side="right")  # e: past every group
  g = jnp.minimum(group, e - 1)
  slot = (padded_ends - padded)[g] + row - (ends - group_sizes)[g]
  trash = tiles * tile  # one zero row for the rows past the groups
  slot = jnp.where(group < e, slot, trash)
  buf = jnp.zeros((trash + 1, d), xs_md.dtype).at[slot].set(xs_md)
  tile_expert = jnp.minimum(
    jnp.searchsorted(padded_ends, jnp.arange(tiles) * tile, side="right"), e - 1
  )

  # Rematerialised: the backward pass saves each tile's rows, not its expert's weights.
  @functools.partial(jax.checkpoint, prevent_cse=False)
  def body(_, args):
    x, i = args
    h = jax.nn.silu(_dot(x, gate_edf[i])) * _dot(x, up_edf[i])
    return None, _dot(h, down_efd[i])

  _, y = jax.lax.scan(body, None, (buf[:trash].reshape(tiles, tile, d), tile_expert))
  y = jnp.concatenate([y.reshape(trash, d), jnp.zeros((1, d), y.dtype)])
  return jnp.take(y, slot, axis=0)


TOKEN_CHUNK = 8192  # tokens per pass of `local_expert_ffn`; more go in equal chunks


def local_expert_ffn(
  x_nd,
  experts_nk,
  weights_nk,
  gate_edf,
  up_edf,
  down_efd,
  first_expert=0,
  grouped=None,
  chunk=TOKEN_CHUNK,
):
  """sum_k weights[n, k] * FFN_{experts[n, k]}(x[n]) over the experts held here.

  gate/up: [E_here, D, F], down: [E_here, F, D] are experts first_expert .. + E_here; slots
  routed elsewhere contribute 0 (they sort last, past every group). grouped: "ragged" or
  "tiles" (default `default_grouped()`). More than `chunk` tokens run as a scan over equal
  chunks, each rematerialised: the sorted copies of the token-slots (k rows per token) and
  their gradients exist for one chunk at a time, at the cost of one more forward pass of
  the experts in the backward pass. Tokens are independent: the same outputs.
  """
  grouped = grouped or default_grouped()
  if grouped not in GROUPED:
    raise ValueError(f"grouped: unknown {grouped!r}; expected one of {GROUPED}")
  n = x_nd.shape[0]
  if n > chunk:
    count = -(-n // chunk)
    size = -(-n // count)
    pad = count * size - n

    def split(a, fill=0):
      a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), constant_values=fill)
      return a.reshape((count, size) + a.shape[1:])

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def one(_, part):
      x, ex, w = part
      return None, _expert_ffn_pass(x, ex, w, gate_edf, up_edf, down_efd, first_expert, grouped)

    # Padding rows go to no expert (-1) and are cut off.
    _, y = jax.lax.scan(one, None, (split(x_nd), split(experts_nk, -1), split(weights_nk)))
    return y.reshape(count * size, -1)[:n]
  return _expert_ffn_pass(
    x_nd, experts_nk, weights_nk, gate_edf, up_edf, down_efd, first_expert, grouped
  )


def _expert_ffn_pass(
  x_nd, experts_nk, weights_nk, gate_edf, up_edf, down_efd, first_expert, grouped
):
  n, k = experts_nk.shape
  e_here = gate_edf.shape[0]
  local = experts_nk.reshape(-1) - first_expert
  key = jnp.where((local >= 0) & (local < e_here), local, e_here)
  order = jnp.argsort(key, stable=True)
  group_sizes = jnp.bincount(key, length=e_here + 1)[:e_here].astype(jnp.int32)
  xs = jnp.take(x_nd, order // k, axis=0)
  ffn = swiglu_ragged if grouped == "ragged" else swiglu_tiles
  out = ffn(xs, group_sizes, gate_edf, up_edf, down_efd)
  inverse = jnp.argsort(order)
  out_nkd = jnp.take(out, inverse, axis=0).reshape(n, k, -1)
  return jnp.einsum("nkd,nk->nd", out_nkd, weights_nk.astype(out_nkd.dtype))


def _gather(w, spec: P):
  """The whole of `w` but its expert dimension: all-gathered over the axes of the others
  (FSDP / tensor shards of the expert weights); the gradient goes back reduce-scattered."""
  for dim, axes in enumerate(tuple(spec)[1:], 1):
    if axes is not None:
      w = jax.lax.all_gather(w, axes, axis=dim, tiled=True)
  return w


def expert_ffn(
  x_btd,
  experts_btk,
  weights_btk,
  gate_edf,
  up_edf,
  down_efd,
  mesh=None,
  batch_axes=(),
  weight_specs=(None, None, None),
):
  """The routed FFN of every token [B, T, D]; expert-parallel when `mesh` has expert > 1.

  batch_axes: the mesh axes that split B (`rlvr.parallel.sharding.data_axes`); when "expert" is one
  of them, each device holds other tokens than its expert peers and gathers theirs.
  weight_specs: the PartitionSpecs the gate / up / down weights are stored with (their
  first dimension on "expert" or unsplit); default: split over "expert" only.
  """
  b, t, d = x_btd.shape
  if mesh is None:
    y = local_expert_ffn(
      x_btd.reshape(b * t, d),
      experts_btk.reshape(b * t, -1),
      weights_btk.reshape(b * t, -1),
      gate_edf,
      up_edf,
      down_efd,
    )
    return y.reshape(b, t, d)
  ep = mesh.shape.get("expert", 1)
  if gate_edf.shape[0] % ep:
    raise ValueError(f"mesh expert={ep} does not divide num_experts {gate_edf.shape[0]}")
  batch_axes = tuple(batch_axes)
  gathered = ep > 1 and "expert" in batch_axes
  tokens = P(batch_axes or None, None, None)
  per_expert = P("expert" if "expert" in mesh.shape else None, None, None)
  weight_specs = tuple(per_expert if w is None else w for w in weight_specs)
  for w in weight_specs:
    if tuple(w)[:1] not in ((), (None,), ("expert",)):
      raise ValueError(f"expert weights: first dimension must be on 'expert', got {w}")

  def body(x, experts, weights, gate, up, down):
    gate, up, down = (_gather(w, sp) for w, sp in zip((gate, up, down), weight_specs))
    bl = x.shape[0]
    if gathered:
      x, experts, weights = (
        jax.lax.all_gather(a, "expert", axis=0, tiled=True) for a in (x, experts, weights)
      )
    first = jax.lax.axis_index("expert") * gate.shape[0] if ep > 1 else 0
    y = local_expert_ffn(
      x.reshape(-1, d),
      experts.reshape(-1, experts.shape[-1]),
      weights.reshape(-1, weights.shape[-1]),
      gate,
      up,
      down,
      first,
    ).reshape(x.shape)
    if gathered:
      y = jax.lax.psum_scatter(y, "expert", scatter_dimension=0, tiled=True)
    elif ep > 1:
      y = jax.lax.psum(y, "expert")
    return y.reshape(bl, t, d)

  return jax.shard_map(
    body,
    mesh=mesh,
    in_specs=(tokens, tokens, tokens, *weight_specs),
    out_specs=tokens,
    check_vma=False,
  )(x_btd, experts_btk, weights_btk, gate_edf, up_edf, down_efd)


# ------------------------------------------------------------ routing statistics
def _slot_counts(experts_sntk, m_nt, num_experts: int):
  """[S, k, E]: the weight m of the tokens whose rank-k choice in sparse layer s is expert
  e, summed (a scatter-add: no [S, B, T, k, E] one-hot, 4 GB at 30B-A3B's 20K-token rows)."""
  s, _, _, k = experts_sntk.shape
  w = jnp.where(experts_sntk >= 0, m_nt[None, :, :, None], 0.0)  # -1: no expert (one_hot's 0)
  layer = jnp.arange(s)[:, None, None, None]
  rank = jnp.arange(k)[None, None, None, :]
  e = jnp.maximum(experts_sntk, 0)
  return jnp.zeros((s, k, num_experts), jnp.float32).at[layer, rank, e].add(w)


def routing_sums(logits_snte, experts_sntk, mask_nt, num_experts: int) -> dict:
  """Per-step routing health of the tokens where mask_nt: sums a micro-batch adds up.

  expert_tokens [S, E]: token-slots each expert took in each sparse layer;
  router_entropy: the router distribution's entropy (nats) summed over tokens,
  averaged over the S layers.
  """
  m = mask_nt.astype(jnp.float32)
  counts = jnp.sum(_slot_counts(experts_sntk, m, num_experts), axis=1)
  logp = jax.nn.log_softmax(logits_snte.astype(jnp.float32), axis=-1)
  ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)  # [S,B,T]
  return {"expert_tokens": counts, "router_entropy": jnp.sum(ent * m) / logits_snte.shape[0]}


def load_balance_loss(logits_snte, experts_sntk, mask_nt, num_experts: int):
  """Switch-Transformer / Qwen3-MoE auxiliary loss over the tokens where mask_nt, all
  sparse layers pooled (as transformers' `load_balancing_loss_func`):
  E * sum_e f_e * P_e, f_e = share of token-slots routed to e (per top-k rank, summed
  over ranks), P_e = mean router probability of e. 1 when the load is uniform."""
  s, _, _, k = experts_sntk.shape
  m = mask_nt.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m) * s, 1.0)
  f_ke = jnp.sum(_slot_counts(experts_sntk, m, num_experts), axis=0) / n
  probs = jax.nn.softmax(logits_snte.astype(jnp.float32), axis=-1)
  p_e = jnp.einsum("sbte,bt->e", probs, m) / n
  return num_experts * jnp.sum(f_ke * p_e[None, :])


def router_z_loss(logits_snte, mask_nt):
  """ST-MoE's router z-loss: the mean over tokens (and sparse layers) of
  logsumexp(router logits)^2."""
  m = mask_nt.astype(jnp.float32)
  z = jax.nn.logsumexp(logits_snte.astype(jnp.float32), axis=-1) ** 2  # [S,B,T]
  return jnp.sum(z * m) / jnp.maximum(jnp.sum(m) * logits_snte.shape[0], 1.0)
