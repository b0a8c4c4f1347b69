"""A buffer built ahead (`buffer.Buffers`, max_staleness 1), kept with the checkpoint.

A one-step off-policy run checkpoints after step t holding step t+1's buffer,
sampled from weights the checkpoint no longer has; resuming must use that exact
buffer, not resample it. It goes to `<dir>/step_<t+1>.npz`: token ids and
logprobs as flat arrays, everything else (prompts, texts, rewards, metrics) as
one JSON string. Floats round-trip exactly (float32 arrays, JSON's shortest repr).
"""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np

from rlvr.common import fileio
from rlvr.rollout.buffer import Buffer
from rlvr.rollout.types import Group, Prompt
from rlvr.sampling.types import Completion


def _plain(x):
  """numpy scalars in a method's metrics (np.int64, np.float32) as Python numbers."""
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"not JSON-able: {type(x).__name__}")


def path(directory: str, step: int) -> str:
  return os.path.join(directory, f"step_{step}.npz")


def save(directory: str, buf: Buffer) -> str:
  """Writes `buf` atomically under `directory`; returns the file's path."""
  comps = [c for g in buf.groups for c in g.completions]
  with_logp = all(c.logprobs is not None for c in comps)
  with_routes = bool(comps) and all(c.routes is not None for c in comps)
  meta = {
    "step": buf.step,
    "version": buf.version,
    "metrics": buf.metrics,
    "with_logprobs": with_logp,
    "with_routes": with_routes,
    "groups": [
      {
        "prompt": [list(g.prompt.ids), g.prompt.answer, g.prompt.text, g.prompt.source],
        "rewards": g.rewards.astype(np.float32).tolist(),
        "correct": g.correct.astype(bool).tolist(),
        "completions": [
          [c.text, c.finish_reason, c.weight_version, c.loss_mask, c.info] for c in g.completions
        ],
        "tags": g.tags,
      }
      for g in buf.groups
    ],
  }
  arrays = {
    "lengths": np.array([len(c.token_ids) for c in comps], np.int64),
    "token_ids": np.array([t for c in comps for t in c.token_ids], np.int64),
    "logprobs": np.array([x for c in comps for x in c.logprobs] if with_logp else [], np.float64),
    "meta": np.array(json.dumps(meta, default=_plain)),
    # a mixture of experts' sampler routes: [prompt + completion tokens, layers, k] each
    "routes": np.concatenate([c.routes for c in comps]) if with_routes else np.zeros(0),
  }
  out = path(directory, buf.step)
  with fileio.atomic_open(out, "wb") as f:
    np.savez(f, **arrays)
  return out


def load(directory: str, step: int) -> Buffer:
  """The buffer `save` wrote for `step`."""
  with np.load(path(directory, step)) as z:
    meta = json.loads(str(z["meta"]))
    lengths, ids, logps, routes = z["lengths"], z["token_ids"], z["logprobs"], z["routes"]
  ends = np.cumsum(lengths)
  starts = ends - lengths
  k, r, groups = 0, 0, []
  for g in meta["groups"]:
    comps = []
    for text, finish, version, *episode in g["completions"]:
      mask, info = episode or (None, None)  # a multi-turn episode's (`rlvr.envs`)
      a, b = int(starts[k]), int(ends[k])
      lp = tuple(float(x) for x in logps[a:b]) if meta["with_logprobs"] else None
      rt = None
      if meta.get("with_routes"):
        n = len(g["prompt"][0]) + b - a
        rt, r = routes[r : r + n], r + n
      comps.append(
        Completion(
          tuple(int(t) for t in ids[a:b]),
          lp,
          text,
          finish,
          version,
          rt,
          tuple(mask) if mask is not None else None,
          info,
        )
      )
      k += 1
    ids_, answer, text, source = g["prompt"]
    groups.append(
      Group(
        Prompt(tuple(ids_), answer, text, source),
        comps,
        np.asarray(g["rewards"], np.float32),
        np.asarray(g["correct"], bool),
        dict(g.get("tags", {})),
      )
    )
  return Buffer(int(meta["step"]), groups, meta["metrics"], int(meta["version"]))


def prune(directory: str, keep_steps) -> None:
  """Removes the saved buffers of steps not in `keep_steps` (the checkpoints kept)."""
  keep = {int(s) for s in keep_steps}
  for f in glob.glob(os.path.join(directory, "step_*.npz")):
    m = re.fullmatch(r"step_(\d+)\.npz", os.path.basename(f))
    if m and int(m.group(1)) not in keep:
      os.remove(f)
