"""One sampler per process, one rollout for all: each process samples its slice of the
prompts on its own servers, and every process gets every completion back.

A multi-host run keeps the host-side program the same on every process (the same
prompts drawn, the same groups kept, the same batch built), so the learner's
global arrays agree without further talk. With the JAX sampler that holds by
construction (one program over the global mesh). A server-backed sampler (vLLM)
is per host: `ProcessSplitSampler` gives process p the p-th contiguous slice of
the prompts, then all-gathers token ids, logprobs, finish reasons, weight versions
and the texts (as UTF-8 bytes), so the result is identical everywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from rlvr.sampling.types import Completion, SamplingParams


def _gather(x: np.ndarray) -> np.ndarray:
  """[...] on each process -> [processes, ...] on every process."""
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x))


def _padded(rows: list[Sequence], dtype, width: int) -> np.ndarray:
  out = np.zeros((len(rows), width), dtype)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return out


class ProcessSplitSampler:
  """Wraps a per-process sampler (e.g. `VLLMSampler` on this host's servers)."""

  # its all-gather is a collective over the learner's devices, which must not interleave
  # with the update's: a buffer built ahead is built before the update (`loop.Rollouts`)
  overlaps_update = False

  def __init__(self, inner):
    self.inner = inner

  def __getattr__(self, name):  # eos / pad ids, urls, ...: the inner sampler's
    return getattr(self.inner, name)

  @property
  def version(self) -> int:
    return self.inner.version

  def update_weights(self, params: Any, version: int) -> None:
    self.inner.update_weights(params, version)

  def close(self) -> None:
    if hasattr(self.inner, "close"):
      self.inner.close()

  def generate(
    self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[list[Completion]]:
    procs, me = jax.process_count(), jax.process_index()
    if procs == 1:
      return self.inner.generate(prompt_token_ids, params)
    n, total = params.n, len(prompt_token_ids)
    per = -(-total // procs)
    mine = list(prompt_token_ids[me * per : (me + 1) * per])
    # Prompt i draws from seed + i (SamplingParams): keep the global index's seed.
    local_params = (
      params if params.seed is None else dataclasses.replace(params, seed=params.seed + me * per)
    )
    local = self.inner.generate(mine, local_params) if mine else []
    flat = [c for group in local for c in group]
    texts = [c.text.encode("utf-8") for c in flat]
    # Agree on widths first, then gather fixed-shape arrays.
    widths = _gather(
      np.array(
        [max((len(c.token_ids) for c in flat), default=0), max((len(t) for t in texts), default=0)],
        np.int32,
      )
    )
    width_tok, width_txt = int(widths[:, 0].max()), int(widths[:, 1].max())
    rows = per * n
    pad = rows - len(flat)
    tokens = np.concatenate(
      [
        _padded([c.token_ids for c in flat], np.int32, width_tok),
        np.zeros((pad, width_tok), np.int32),
      ]
    )
    logps = np.concatenate(
      [
        _padded([c.logprobs or () for c in flat], np.float32, width_tok),
        np.zeros((pad, width_tok), np.float32),
      ]
    )
    txt = np.concatenate(
      [_padded([list(t) for t in texts], np.uint8, width_txt), np.zeros((pad, width_txt), np.uint8)]
    )
    meta = np.zeros((rows, 4), np.int32)  # tokens, text bytes, stopped, weight version
    for i, (c, t) in enumerate(zip(flat, texts)):
      meta[i] = (len(c.token_ids), len(t), c.finish_reason == "stop", c.weight_version or 0)
    tokens, logps, txt, meta = (_gather(a) for a in (tokens, logps, txt, meta))
    out: list[list[Completion]] = []
    for p in range(procs):
      count = max(0, min(per, total - p * per))
      for g in range(count):
        group = []
        for j in range(n):
          r = g * n + j
          length, text_len, stopped, version = (int(v) for v in meta[p, r])
          group.append(
            Completion(
              token_ids=tuple(int(t) for t in tokens[p, r, :length]),
              logprobs=(tuple(float(x) for x in logps[p, r, :length]) if params.logprobs else None),
              text=bytes(txt[p, r, :text_len]).decode("utf-8"),
              finish_reason="stop" if stopped else "length",
              weight_version=version,
            )
          )
        out.append(group)
    return out
