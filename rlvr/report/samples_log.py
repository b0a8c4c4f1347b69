"""Training responses on disk: `<workdir>/samples/step_<k>.jsonl`, every `rl.log_samples_every`
RL steps (steps 0, N, 2N, ...).

A logged step's file holds one JSON object per response (`records`): first the groups
the step's rollout metrics describe (`reward_mean`, `accuracy`: every group sampled,
kept or not), then the update's groups not among them (SvS's synthesis and synthetic
problems). Each file is written whole and atomically, so a run that resumes at step s
replaces the files of the steps it runs again; the files of steps >= s are removed when
it starts (`SamplesLog`), so none is left over from the run before. A one-step
off-policy run (`rl.loop.max_staleness` 1) resumed with a buffer built ahead logs only
that buffer's groups for its first step: the checkpoint keeps the update's groups, not
every sampled one.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Callable, Sequence

from rlvr import envs
from rlvr.common import fileio

SHOWN = 4  # responses of a logged step shown as text in TensorBoard and wandb
_FILE = re.compile(r"step_(\d+)\.jsonl")


def records(
  step: int, groups: Sequence, sampled: Sequence, decode: Callable | None = None
) -> list[dict[str, Any]]:
  """One dict per response of the step's sampled groups, then of the update's `groups`
  not among them.

  Fields: step; group (its index in this list) and index (the response's in its group);
  source (where the prompt came from) and tags (a method's labels, e.g. SvS's
  data_type); kept (the group is in the update's buffer); prompt (decode(prompt ids): the
  prompt as the policy saw it, special ids marked ⟦<|im_start|>⟧ by the run's decoder
  (`rlvr.data.tokens.decode_marked`); without decode, the problem text); answer (the
  reference the verifier scored against); response (its text); response_seen
  (decode(response ids), with decode only: every token the sequence holds, special ids
  marked, an episode's observations included); reward (the verifier's, shaping included:
  what the advantages are computed from); correct (the verifier's verdict); finish_reason;
  response_tokens.
  """
  in_update = {id(g) for g in groups}
  seen = {id(g) for g in sampled}
  out = []
  for k, g in enumerate([*sampled, *(g for g in groups if id(g) not in seen)]):
    prompt = decode(g.prompt.ids) if decode is not None else g.prompt.text
    for i, c in enumerate(g.completions):
      out.append(
        {
          "step": int(step),
          "group": k,
          "index": i,
          "source": g.prompt.source,
          "tags": dict(g.tags),
          "kept": id(g) in in_update,
          "prompt": prompt,
          "answer": g.prompt.answer,
          "response": c.text,
          **({"response_seen": decode(c.token_ids)} if decode is not None else {}),
          "reward": float(g.rewards[i]),
          "correct": bool(g.correct[i]),
          "finish_reason": c.finish_reason,
          "response_tokens": len(c.token_ids),
          **envs.episode_record(c),
        }
      )
  return out


def path(workdir: str, step: int) -> str:
  return os.path.join(workdir, "samples", f"step_{step}.jsonl")


def logged_steps(workdir: str) -> list[int]:
  """The steps with a samples file, in order."""
  folder = os.path.join(workdir, "samples")
  names = os.listdir(folder) if os.path.isdir(folder) else []
  return sorted(int(m.group(1)) for n in names if (m := _FILE.fullmatch(n)))


class SamplesLog:
  """Writes the responses of every `every`-th step (0, every, 2 every, ...; 0: none).

  decode(prompt ids) -> text renders each prompt; show(step, rows) gets the first `SHOWN`
  records of each written step (`metrics.MetricsWriter.write_table`: TensorBoard, wandb).
  A run resuming at `resume_step` first removes the files of steps >= resume_step.
  Only the writing process (`enabled`; multi-host: process 0) touches the files.
  """

  def __init__(
    self,
    workdir: str,
    every: int,
    *,
    resume_step: int = 0,
    decode: Callable | None = None,
    show: Callable[[int, list[dict]], None] | None = None,
    enabled: bool = True,
  ):
    self.workdir, self.every, self.decode, self.show = workdir, every, decode, show
    self.enabled = enabled
    if enabled:
      for step in logged_steps(workdir):
        if step >= resume_step:
          with contextlib.suppress(FileNotFoundError):
            os.remove(path(workdir, step))

  def due(self, step: int) -> bool:
    return self.enabled and self.every > 0 and step % self.every == 0

  def write(self, step: int, groups: Sequence, sampled: Sequence) -> str:
    """Writes step `step`'s file (replacing one there); returns its path."""
    rows = records(step, groups, sampled, self.decode)
    out = path(self.workdir, step)
    fileio.write_jsonl(out, rows)
    if self.show is not None and rows:
      self.show(step, rows[:SHOWN])
    return out
