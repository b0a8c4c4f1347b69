"""A step's episode metrics, from the `info` of its multi-turn completions."""

from __future__ import annotations

from collections.abc import Sequence

from rlvr.sampling.types import Completion


def episode_metrics(completions: Sequence[Completion]) -> dict[str, float]:
  """turns_mean, tool_calls_mean, tool_time_s (summed), obs_tokens_frac (observation share
  of the episodes' tokens), tool_error_frac_<status> (of tool calls), budget_<which>_frac
  and other counters an environment keeps (per episode); {} for single-turn rollouts."""
  infos = [c.info for c in completions if isinstance(c.info, dict)]
  if not infos:
    return {}
  n = len(infos)
  sums: dict[str, float] = {}
  for info in infos:
    for k, v in info.items():
      if isinstance(v, (int, float)):  # not the spans
        sums[k] = sums.get(k, 0.0) + float(v)
  calls = sums.pop("tool_calls", 0.0)
  tokens = sum(len(c.token_ids) for c in completions if isinstance(c.info, dict))
  out = {
    "turns_mean": sums.pop("turns", 0.0) / n,
    "tool_calls_mean": calls / n,
    "tool_time_s": sums.pop("tool_time_s", 0.0),
    "obs_tokens_frac": sums.pop("observation_tokens", 0.0) / max(tokens, 1),
  }
  for k, v in sorted(sums.items()):
    if k.startswith("tool_error_"):
      out[k.replace("tool_error_", "tool_error_frac_", 1)] = v / max(calls, 1.0)
    elif k.startswith("budget_"):
      out[f"{k}_frac"] = v / n
    else:
      out[f"env_{k}"] = v / n
  return out


def episode_record(c: Completion) -> dict:
  """What a samples file adds for an episode: its turns and tool calls, and `spans`, the
  transcript as [["policy" | "env", text], ...] (the environment's parts marked); {} for a
  single response."""
  if not isinstance(c.info, dict):
    return {}
  keys = ("turns", "tool_calls", "spans")
  return {k: c.info[k] for k in keys if k in c.info}
