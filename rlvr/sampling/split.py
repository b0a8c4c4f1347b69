"""One sampler per process, one rollout for all: each process samples its slice of the
prompts on its own servers, and every process gets every completion back.

A multi-host run keeps the host-side program the same on every process (the same
prompts drawn, the same groups kept, the same batch built), so the learner's
global arrays agree without further talk. With the JAX sampler that holds by
construction (one program over the global mesh). A server-backed sampler (vLLM)
is per host: `ProcessSplitSampler` gives process p the p-th contiguous slice of
the prompts, then all-gathers token ids, logprobs, finish reasons, weight versions
and the texts through the coordinator's key-value store (`distributed.HostChannel`, not a
device collective, so it may run during the update), so the result is identical everywhere.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Sequence

import jax
import numpy as np

from rlvr.parallel.distributed import HostChannel
from rlvr.sampling.types import Completion, SamplingParams


def _pack(flat: Sequence[Completion]) -> bytes:
  """Completions as bytes: token ids, logprobs (float64, as sampled), texts, ends, versions,
  an episode's loss mask and counters."""
  buf = io.BytesIO()
  np.savez(
    buf,
    lengths=np.array([len(c.token_ids) for c in flat], np.int64),
    tokens=np.array([t for c in flat for t in c.token_ids], np.int64),
    logprobs=np.array([x for c in flat for x in (c.logprobs or ())], np.float64),
    meta=np.array(
      json.dumps(
        [
          [c.text, c.finish_reason, c.weight_version, c.logprobs is not None, c.loss_mask, c.info]
          for c in flat
        ]
      )
    ),
    # a mixture of experts' routes, [tokens, layers, k] per completion (0 tokens: none)
    route_lengths=np.array([0 if c.routes is None else len(c.routes) for c in flat], np.int64),
    routes=np.concatenate([c.routes for c in flat if c.routes is not None] or [np.zeros(0)]),
  )
  return buf.getvalue()


def _unpack(data: bytes) -> list[Completion]:
  with np.load(io.BytesIO(data)) as z:
    lengths, tokens, logps, meta = (
      z["lengths"],
      z["tokens"],
      z["logprobs"],
      json.loads(str(z["meta"])),
    )
    route_lengths, routes = z["route_lengths"], z["routes"]
  out, t, lp, rt = [], 0, 0, 0
  for length, n_routes, (text, finish, version, has_logp, mask, info) in zip(
    lengths, route_lengths, meta
  ):
    length, n_routes = int(length), int(n_routes)
    logprobs = tuple(float(x) for x in logps[lp : lp + length]) if has_logp else None
    lp += length if has_logp else 0
    given = routes[rt : rt + n_routes].astype(np.int32) if n_routes else None
    rt += n_routes
    out.append(
      Completion(
        tuple(int(x) for x in tokens[t : t + length]),
        logprobs,
        text,
        finish,
        version,
        given,
        tuple(mask) if mask is not None else None,
        info,
      )
    )
    t += length
  return out


class ProcessSplitSampler:
  """Wraps a per-process sampler (e.g. `VLLMSampler` on this host's servers)."""

  def __init__(self, inner):
    self.inner = inner
    self.channel = HostChannel()

  @property
  def overlaps_update(self) -> bool:
    """The gather is host-side (`HostChannel`): as the inner sampler."""
    return self.inner.overlaps_update

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
    slices = [_unpack(b) for b in self.channel.allgather(_pack([c for g in local for c in g]))]
    return [s[g * n : (g + 1) * n] for s in slices for g in range(len(s) // n)]
