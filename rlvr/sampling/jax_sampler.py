"""In-process sampler: jitted prefill + decode loop on the model's KV cache.

Shapes are bucketed (rows and prompt length to powers of two, new tokens to
a power of two), and temperature / top-k / top-p / repetition penalty / seeds
are traced values, so a handful of compilations serve a whole run.

The repetition penalty follows vLLM (`vllm/_custom_ops.py`
`apply_repetition_penalties_torch`, called from the v1 sampler's
`apply_penalties` on prompt_mask | output_mask): a [rows, vocab] "seen" mask
of the prompt (padding excluded) and the tokens sampled so far rides in the
decode loop, and only calls with a penalty other than 1 carry it (a static
flag), so unpenalized sampling is the same computation as without the feature.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rlvr.model import decoder, lora
from rlvr.model.config import ModelConfig
from rlvr.parallel import sharding
from rlvr.sampling.types import Completion, SamplingParams


def _bucket(n: int, minimum: int) -> int:
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


@jax.jit
def _row_keys(seeds_r: jax.Array, samples_r: jax.Array) -> jax.Array:
  """[R, 2] raw keys: sample j of the prompt with seed s draws from fold_in(PRNGKey(s), j)."""
  return jax.vmap(lambda s, j: jax.random.fold_in(jax.random.PRNGKey(s), j))(seeds_r, samples_r)


@flax.struct.dataclass
class _RowSettings:
  temperature: jax.Array  # [R] f32; 0 = greedy
  top_p: jax.Array  # [R] f32
  top_k: jax.Array  # [R] i32; 0 = off
  repetition_penalty: jax.Array  # [R] f32; 1 = off
  keys: jax.Array  # [R, 2] u32 per-row PRNG keys
  max_new: jax.Array  # [] i32
  stop_ids: jax.Array  # [S] i32, padded with -1
  live: jax.Array  # [R] bool; False for bucket filler rows


def filter_logits(logits_rv: jax.Array, temperature, top_k, top_p) -> jax.Array:
  """Temperature-scaled logits with everything outside top-k / top-p at -inf."""
  z = logits_rv / jnp.maximum(temperature, 1e-6)[:, None]
  v = z.shape[-1]
  sorted_z = jnp.sort(z, axis=-1)[:, ::-1]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
  kth = jnp.take_along_axis(sorted_z, (k - 1)[:, None], axis=-1)
  z = jnp.where(z < kth, -jnp.inf, z)
  # top-p on the (top-k filtered) distribution: keep the smallest prefix whose
  # mass reaches p (the token that crosses p stays in).
  sorted_z = jnp.where(jnp.arange(v)[None] < k[:, None], sorted_z, -jnp.inf)
  probs = jax.nn.softmax(sorted_z, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs
  cutoff_idx = jnp.sum(before < top_p[:, None], axis=-1) - 1
  cutoff = jnp.take_along_axis(sorted_z, cutoff_idx[:, None], axis=-1)
  return jnp.where(z < cutoff, -jnp.inf, z)


def prompt_seen_mask(prompts_rp: jax.Array, valid_rp: jax.Array, vocab: int) -> jax.Array:
  """[R, vocab] bool: which token ids occur among each row's valid (non-padding) prompt tokens."""
  r = prompts_rp.shape[0]
  idx = jnp.where(valid_rp, prompts_rp, vocab)  # padding goes out of range and is dropped
  return jnp.zeros((r, vocab), bool).at[jnp.arange(r)[:, None], idx].set(True, mode="drop")


def mark_seen(seen_rv: jax.Array, tok_r: jax.Array) -> jax.Array:
  """`seen_rv` with each row's token `tok_r` added."""
  return seen_rv.at[jnp.arange(seen_rv.shape[0]), tok_r].set(True, mode="drop")


def apply_repetition_penalty(
  logits_rv: jax.Array, seen_rv: jax.Array, penalty_r: jax.Array
) -> jax.Array:
  """vLLM's repetition penalty: seen tokens' logits scaled by 1/p when > 0, else by p.

  As vLLM computes it (multiplying by the float32 reciprocal, not dividing);
  HF's `RepetitionPenaltyLogitsProcessor` divides, within an ulp of this.
  """
  pen = jnp.where(seen_rv, penalty_r.astype(jnp.float32)[:, None], 1.0)
  return logits_rv * jnp.where(logits_rv > 0, 1.0 / pen, pen)


def _sample(logits_rv, s: _RowSettings, step, filtered: bool, seen_rv=None):
  """(token, its raw-model logprob) per row. `seen_rv` (None: no penalty) switches the
  repetition penalty on: it shapes the token choice, never the returned logprob."""
  logits = logits_rv.astype(jnp.float32)
  raw_logp = jax.nn.log_softmax(logits, axis=-1)
  base = raw_logp
  if seen_rv is not None:
    base = jax.nn.log_softmax(
      apply_repetition_penalty(logits, seen_rv, s.repetition_penalty), axis=-1
    )
  greedy = jnp.argmax(base, axis=-1)
  if filtered:
    z = filter_logits(base, s.temperature, s.top_k, s.top_p)
  else:
    z = base / jnp.maximum(s.temperature, 1e-6)[:, None]
  keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(s.keys)
  drawn = jax.vmap(jax.random.categorical)(keys, z)
  tok = jnp.where(s.temperature > 0, drawn, greedy).astype(jnp.int32)
  return tok, jnp.take_along_axis(raw_logp, tok[:, None], axis=-1)[:, 0]


def _generate(
  params,
  prompts_up,
  prompt_seg_up,
  row_prompt_r,
  settings: _RowSettings,
  *,
  config: ModelConfig,
  max_new_bucket: int,
  filtered: bool,
  penalized: bool,
):
  """Prefill each distinct prompt once ([U, p]), then give row r the cache and last logits
  of its prompt `row_prompt_r[r]`: the n samples of a prompt share one prefill (vLLM's
  prefix cache does the same), and rows are independent, so values are unchanged.
  A mixture of experts also returns the experts each input token went to: the prompts'
  [S, R, p, k] and the completions' [R, max_new, S, k] (-1 where no token was fed)."""
  u, p = prompts_up.shape
  moe = config.is_moe
  cache = decoder.KVCache.empty(config, u, p + max_new_bucket, jax.tree.leaves(params)[0].dtype)
  out = decoder.forward(
    params, prompts_up, config=config, segment_ids=prompt_seg_up, cache=cache, return_routing=moe
  )
  logits, cache = out[:2]
  prompt_routes = jnp.take(out[2].experts, row_prompt_r, axis=1) if moe else None
  rows = lambda x, axis: jnp.take(x, row_prompt_r, axis=axis)
  cache = cache.replace(
    k=rows(cache.k, 1), v=rows(cache.v, 1), segment_bs=rows(cache.segment_bs, 0)
  )
  logits = rows(logits, 0)
  prompts_rp, prompt_seg_rp = rows(prompts_up, 0), rows(prompt_seg_up, 0)
  r = prompts_rp.shape[0]
  seen = None  # no penalty: nothing extra in the loop
  if penalized:
    seen = prompt_seen_mask(prompts_rp, prompt_seg_rp > 0, logits.shape[-1])
  tok, lp = _sample(logits[:, -1], settings, 0, filtered, seen)
  if penalized:
    seen = mark_seen(seen, tok)
  out_tok = jnp.zeros((r, max_new_bucket), jnp.int32).at[:, 0].set(tok)
  out_lp = jnp.zeros((r, max_new_bucket), jnp.float32).at[:, 0].set(lp)
  done = jnp.isin(tok, settings.stop_ids) | ~settings.live
  lengths = jnp.ones((r,), jnp.int32)
  s_k = (config.num_sparse_layers, config.num_experts_per_tok) if moe else (0, 0)
  out_routes = jnp.full((r, max_new_bucket) + s_k, -1, jnp.int32)

  def cond(carry):
    i, _, _, _, done, _, _, _, _ = carry
    return (i < settings.max_new) & ~jnp.all(done)

  def body(carry):
    i, cache, out_tok, out_lp, done, lengths, last, seen, out_routes = carry
    seg = jnp.where(done, 0, 1).astype(jnp.int32)[:, None]
    out = decoder.forward(
      params, last[:, None], config=config, segment_ids=seg, cache=cache, return_routing=moe
    )
    logits, cache = out[:2]
    if moe:  # the experts of the token fed here: completion token i - 1
      step_routes = jnp.where(done[:, None, None], -1, jnp.swapaxes(out[2].experts[:, :, 0], 0, 1))
      out_routes = jax.lax.dynamic_update_slice_in_dim(out_routes, step_routes[:, None], i - 1, 1)
    tok, lp = _sample(logits[:, 0], settings, i, filtered, seen)
    if penalized:
      seen = mark_seen(seen, tok)
    out_tok = jax.lax.dynamic_update_slice_in_dim(out_tok, jnp.where(done, 0, tok)[:, None], i, 1)
    out_lp = jax.lax.dynamic_update_slice_in_dim(out_lp, jnp.where(done, 0.0, lp)[:, None], i, 1)
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | jnp.isin(tok, settings.stop_ids)
    return i + 1, cache, out_tok, out_lp, done, lengths, tok, seen, out_routes

  _, _, out_tok, out_lp, done, lengths, _, _, out_routes = jax.lax.while_loop(
    cond, body, (jnp.int32(1), cache, out_tok, out_lp, done, lengths, tok, seen, out_routes)
  )
  return out_tok, out_lp, lengths, done, prompt_routes, out_routes


class JaxSampler:
  """Samples from `params` in this process (CPU, or the devices of `mesh`)."""

  # it runs on the learner's devices: a buffer built ahead (rl.loop.max_staleness=1)
  # is built before the update, not during it (`rollout.Buffers`)
  overlaps_update = False

  def __init__(
    self,
    config: ModelConfig,
    params: Any,
    tokenizer,
    *,
    mesh=None,
    min_rows: int = 8,
    min_prompt_len: int = 32,
    min_new_tokens: int = 32,
  ):
    self.config = config
    self.tokenizer = tokenizer
    self.eos_token_id = tokenizer.eos_token_id if tokenizer is not None else config.eos_token_id
    pad = getattr(tokenizer, "pad_token_id", None)
    self.pad_token_id = pad if pad is not None else 0
    self.mesh = mesh
    self._min = (min_rows, min_prompt_len, min_new_tokens)
    self._params = lora.as_params(params)  # LoRA adapters: merged once per version
    self.version = 0
    self._lock = threading.Lock()
    self._fn = jax.jit(
      functools.partial(_generate, config=config),
      static_argnames=("max_new_bucket", "filtered", "penalized"),
    )

  def update_weights(self, params: Any, version: int) -> None:
    """Serves `params` (or `lora.Adapted`, merged here) from now on as `version`."""
    params = lora.as_params(params)
    with self._lock:
      self._params = params
      self.version = version

  def _place(self, x, rows: bool = True):
    if self.mesh is None:
      return jnp.asarray(x)
    # Every process builds the same host arrays; each device takes its rows (multi-host too).
    spec = (
      sharding.batch_sharding(self.mesh, np.ndim(x)) if rows else sharding.replicated(self.mesh)
    )
    return sharding.put_global(x, spec)

  def _place_settings(self, s: _RowSettings) -> _RowSettings:
    """Per-row settings split with the rows; the stop ids, shared by all rows, replicated."""
    placed = jax.tree.map(self._place, s.replace(stop_ids=None))
    return placed.replace(stop_ids=self._place(s.stop_ids, rows=False))

  def generate(
    self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[list[Completion]]:
    if not prompt_token_ids:
      return []
    for i, p in enumerate(prompt_token_ids):
      if len(p) == 0:
        raise ValueError(f"prompt {i}: empty token list")
    n = params.n
    rows = [list(p) for p in prompt_token_ids for _ in range(n)]
    min_rows, min_p, min_new = self._min
    r_bucket = _bucket(len(rows), min_rows)
    longest, ctx = max(len(p) for p in rows), self.config.max_position_embeddings
    if longest + params.max_tokens > ctx:
      raise ValueError(
        f"a prompt of {longest} tokens + max_tokens {params.max_tokens} exceed "
        f"the model's max_position_embeddings {ctx}"
      )
    p_bucket = _bucket(longest, min_p)
    new_bucket = _bucket(params.max_tokens, min_new)
    if p_bucket + new_bucket > ctx:  # near the context limit: tighter, non-power-of-two shapes
      new_bucket = max(params.max_tokens, min(new_bucket, ctx - longest))
      p_bucket = min(p_bucket, ctx - new_bucket)
    u_bucket = _bucket(len(prompt_token_ids), min_rows)
    tokens = np.full((u_bucket, p_bucket), self.pad_token_id, np.int32)
    seg = np.zeros((u_bucket, p_bucket), np.int32)
    for i, p in enumerate(prompt_token_ids):  # left padding: the last column is the last token
      tokens[i, p_bucket - len(p) :] = p
      seg[i, p_bucket - len(p) :] = 1
    seg[len(prompt_token_ids) :, -1] = 1  # filler prompts: one real token keeps them NaN-free
    base = 0 if params.seed is None else params.seed
    prompt_idx = np.repeat(np.arange(len(prompt_token_ids)), n)
    row_prompt = np.zeros((r_bucket,), np.int32)  # filler rows read prompt 0; never live
    row_prompt[: len(rows)] = prompt_idx
    sample_idx = np.tile(np.arange(n), len(prompt_token_ids))
    keys = np.zeros((r_bucket, 2), np.uint32)
    keys[: len(rows)] = _row_keys(
      (base + prompt_idx).astype(np.uint32), sample_idx.astype(np.uint32)
    )
    stops = set(params.stop_token_ids)
    if not params.ignore_eos and self.eos_token_id is not None:
      stops.add(int(self.eos_token_id))
    stop_ids = np.full((_bucket(len(stops), 4),), -1, np.int32)
    stop_ids[: len(stops)] = sorted(stops)
    settings = _RowSettings(
      temperature=np.full((r_bucket,), params.temperature, np.float32),
      top_p=np.full((r_bucket,), params.top_p, np.float32),
      top_k=np.full((r_bucket,), params.top_k, np.int32),
      repetition_penalty=np.full((r_bucket,), params.repetition_penalty, np.float32),
      keys=keys,
      max_new=np.int32(params.max_tokens),
      stop_ids=stop_ids,
      live=np.arange(r_bucket) < len(rows),
    )
    with self._lock:
      weights, version = self._params, self.version
      out_tok, out_lp, lengths, done, prompt_routes, out_routes = self._fn(
        weights,
        self._place(tokens),
        self._place(seg),
        self._place(row_prompt),
        self._place_settings(settings),
        max_new_bucket=new_bucket,
        filtered=params.top_k > 0 or params.top_p < 1.0,
        penalized=params.repetition_penalty != 1.0,
      )
    out_tok, out_lp, lengths, done = (sharding.to_host(x) for x in (out_tok, out_lp, lengths, done))
    if self.config.is_moe:
      prompt_routes, out_routes = sharding.to_host(prompt_routes), sharding.to_host(out_routes)
    result: list[list[Completion]] = [[] for _ in prompt_token_ids]
    for i in range(len(rows)):
      ids = tuple(int(t) for t in out_tok[i, : lengths[i]])
      routes = None
      if self.config.is_moe:  # prompt tokens (left-padded in the prefill), then completion
        plen = len(rows[i])
        routes = np.concatenate(
          [np.swapaxes(prompt_routes[:, i, p_bucket - plen :], 0, 1), out_routes[i, : lengths[i]]]
        ).astype(np.int32)
      text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer else ""
      result[prompt_idx[i]].append(
        Completion(
          token_ids=ids,
          logprobs=tuple(float(x) for x in out_lp[i, : lengths[i]]) if params.logprobs else None,
          text=text,
          finish_reason="stop" if done[i] else "length",
          weight_version=version,
          routes=routes,
        )
      )
    return result
