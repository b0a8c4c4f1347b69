"""Sequence packing: scored groups and token rows -> the arrays of a `learner.TrainBatch`.

`pack_rows` lays (prompt, completion, logprobs) rows out as every update sees
them (RL buffers and SFT alike), one sequence per row or, with `first_fit`'s bins,
several side by side; `build_batch` turns a buffer's groups (`rollout.Group`) into
such arrays with their advantages (`group_advantages`), in bucketed shapes (`bucket`) so that the
jitted update compiles a handful of times per run. What the arrays look like follows the
learner's settings (`LearnerConfig`: advantage estimator, packing) and the step's shapes
(`BatchShape`: rows and tokens of a whole buffer).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from rlvr import objectives


def first_fit(lengths, capacity: int) -> list[list[int]]:
  """Sequence indices per row, packing `lengths` into rows of `capacity` tokens by
  first-fit decreasing (longest first, ties by index, so every process gets the same
  rows). A sequence longer than a row gets one to itself (and loses its tail)."""
  rows, free = [], []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    n = min(lengths[i], capacity)
    for r, room in enumerate(free):
      if room >= n:
        rows[r].append(i)
        free[r] -= n
        break
    else:
      rows.append([i])
      free.append(capacity - n)
  return rows


def pack_rows(
  rows, n_rows: int, seq_len: int, pad_id: int = 0, bins: list[list[int]] | None = None
) -> dict[str, np.ndarray]:
  """(prompt ids, completion ids, completion logprobs or None[, routes[, loss mask]]) rows ->
  right-padded arrays (routes: a mixture of experts' [tokens, layers, k] experts per input
  token; loss mask: a multi-turn episode's, 0 on the environment's observations).

  The layout every update sees (RL buffers and SFT alike): prompt, then the
  completion (the only tokens in the loss, less an episode's observations), then
  padding; rows past the given ones are all padding. A row longer than seq_len loses its tail.
  bins (e.g. `first_fit`): the input sequences each array row holds, side by side
  as segments 1, 2, ...; the arrays then add `positions_bt` (restarting at 0 with
  each sequence) and `sequence_bt` (the input index of each token, -1 on padding).
  """
  packed = bins is not None
  bins = [[i] for i in range(len(rows))] if bins is None else bins
  if len(bins) > n_rows:
    raise ValueError(f"pack_rows: {len(bins)} rows do not fit n_rows={n_rows}")
  tokens = np.full((n_rows, seq_len), pad_id, np.int32)
  seg = np.zeros((n_rows, seq_len), np.int32)
  mask = np.zeros((n_rows, seq_len), np.float32)
  sampler_logp = np.zeros((n_rows, seq_len), np.float32)
  positions = np.zeros((n_rows, seq_len), np.int32)
  sequence = np.full((n_rows, seq_len), -1, np.int32)
  routed = [r[3] for r in rows if len(r) > 3 and r[3] is not None]
  routes = None
  if routed:  # mixture of experts: the sampler's experts per input token, -1 elsewhere
    routes = np.full((n_rows, seq_len) + routed[0].shape[1:], -1, np.int32)
  for r, members in enumerate(bins):
    start = 0
    for s, i in enumerate(members, 1):
      prompt, completion, logprobs = rows[i][:3]
      turns = rows[i][4] if len(rows[i]) > 4 else None  # 0 on an episode's observations
      if routes is not None and len(rows[i]) > 3 and rows[i][3] is not None:
        given = rows[i][3][: seq_len - start]
        routes[r, start : start + len(given)] = given
      ids = (list(prompt) + list(completion))[: seq_len - start]
      p, end = start + len(prompt), start + len(ids)
      tokens[r, start:end] = ids
      seg[r, start:end] = s
      mask[r, p:end] = 1 if turns is None else np.asarray(turns[: end - p], np.float32)
      positions[r, start:end] = np.arange(end - start)
      sequence[r, start:end] = i
      if logprobs is not None and end > p:
        sampler_logp[r, p:end] = logprobs[: end - p]
      start = end
  out = dict(
    tokens_bt=tokens,
    segment_bt=seg,
    loss_mask_bt=mask,
    sampler_logp_bt=sampler_logp,
    loss_positions_bk=loss_positions(mask),
  )
  if routes is not None:
    out["routes_bt"] = routes
  if packed:
    out.update(positions_bt=positions, sequence_bt=sequence)
  return out


def loss_positions(mask_bt: np.ndarray, minimum: int = 16) -> np.ndarray:
  """[B, K] the positions of each row's loss tokens (all >= 1: a position's logprob comes
  from the one before), 0 in unused slots; K the most any row has, as a power of two >=
  `minimum` (few shapes), at most the row length. The learner applies its LM head there
  only (`TrainBatch.loss_positions_bk`)."""
  rows, width = mask_bt.shape
  where = [np.flatnonzero(m[1:]) + 1 for m in mask_bt]
  k = min(bucket(max((len(w) for w in where), default=0), minimum), width)
  out = np.zeros((rows, k), np.int32)
  for r, w in enumerate(where):
    out[r, : len(w)] = w
  return out


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """The step's shapes a buffer's batches start from (`rollout.RLConfig.batch_shape`):
  rows of a whole buffer (prompts x group size), responses per prompt, and the token length
  of a row (prompt + response budget, a multiple of 16)."""

  rows: int
  group_size: int
  seq_len: int

  def mini_batch_rows(self, cfg) -> int:
    """Rows of one mini-batch of full groups under the learner's `ppo_mini_batch_size`
    (the smallest shape a mini-batch is padded to)."""
    return cfg.ppo_mini_batch_size * self.group_size if cfg.ppo_mini_batch_size else self.rows


def bucket(n: int, minimum: int, multiple: int = 1) -> int:
  """`minimum` when n fits, else the next power of two >= n (a multiple of `multiple`)."""
  b = minimum if n <= minimum else 1 << (n - 1).bit_length()
  return -(-b // multiple) * multiple


def group_advantages(groups: Sequence, cfg) -> list[np.ndarray]:
  """One advantage array per group of a whole buffer, by the `LearnerConfig`'s
  `advantage_estimator`
  (`objectives.advantages`), computed before any mini-batch split, so batch-normalised
  estimators (REINFORCE++) see every group of the rollout."""
  return objectives.advantages(
    cfg.advantage_estimator,
    [g.rewards for g in groups],
    [np.array([c.policy_tokens for c in g.completions]) for g in groups],
    cfg.adv_std_ddof,
  )


def build_batch(
  groups: Sequence,
  cfg,
  shape: BatchShape,
  pad_id: int,
  *,
  advantages: Sequence[np.ndarray] | None = None,
  rows: int | None = None,
  seq_len: int | None = None,
  min_rows: int | None = None,
) -> dict[str, np.ndarray]:
  """Right-padded [rows, seq_len] arrays of `rollout.Group`s under a `LearnerConfig` cfg:
  prompt, then completion (in the loss), then pad.

  Rows beyond the groups are padding (no loss tokens). advantages: one array per group
  (`group_advantages` of the whole buffer, which the update computes once before it
  splits the buffer into mini-batches); None computes them for these groups alone.
  Default shape: shape.rows (or `min_rows`) x shape.seq_len, grown to the next power
  of two when the groups need more (a larger buffer, a longer prompt), so shapes
  stay few. With `cfg.pack` the sequences are packed side by side into rows of
  max(cfg.pack_len, that seq_len) tokens (`first_fit`), as few rows as they
  need rounded up to a power of two >= cfg.pack_min_rows, with per-token
  advantages and truncation flags.
  """
  seqs = [
    (g.prompt.ids, c.token_ids, c.logprobs, c.routes, c.loss_mask)
    for g in groups
    for c in g.completions
  ]
  lengths = [len(s[0]) + len(s[1]) for s in seqs]
  advantages = group_advantages(groups, cfg) if advantages is None else advantages
  adv = np.concatenate([np.zeros(0, np.float32), *advantages]).astype(np.float32)
  if len(adv) != len(seqs):
    raise ValueError(f"build_batch: {len(adv)} advantages for {len(seqs)} sequences")
  truncated = np.array([c.finish_reason == "length" for g in groups for c in g.completions], bool)
  seq_len = bucket(max(lengths, default=0), shape.seq_len, 16) if seq_len is None else seq_len
  if cfg.pack:
    seq_len = max(seq_len, cfg.pack_len)
    bins = first_fit(lengths, seq_len)
    rows = bucket(len(bins), cfg.pack_min_rows) if rows is None else rows
    arrays = pack_rows(seqs, rows, seq_len, pad_id, bins=bins)
    index = arrays.pop("sequence_bt")
    real = index >= 0
    return dict(
      arrays,
      advantages=np.where(real, adv[index], 0.0).astype(np.float32),
      truncated=real & truncated[index],
    )
  rows = bucket(len(seqs), min_rows or shape.rows) if rows is None else rows
  arrays = pack_rows(seqs, rows, seq_len, pad_id)
  return dict(
    arrays,
    advantages=np.pad(adv, (0, rows - len(seqs))),
    truncated=np.pad(truncated, (0, rows - len(seqs))),
  )
