"""Run health, watched while it trains: warnings from the metrics every RL step logs.

`Monitor.observe(step, metrics)` takes one step's metrics row (as metrics.jsonl holds it) and
returns the warnings that start at that step. A warning fires once per episode of trouble:
when its condition starts to hold; it fires again only after the condition has cleared and
starts again. The conditions (docs/health.md says what each means and what to try):

  reward_without_correctness  reward_mean rises while correctness (held-out pass@1 where the
                              run evaluates every N steps, else accuracy) stays flat or falls;
                              only for a shaped or custom reward
  length_explodes / length_collapses
                              response_len_mean grows / shrinks by `length_ratio`
  truncation_climbs           truncated_frac (cut at rl.loop.max_response_len) rises
  entropy_collapses           entropy falls to `entropy_ratio` of its start
  repetition_rises            repeated_3gram_frac (responses repeating themselves) rises
  kl_spike / ratio_spike      one step's kl, mismatch_kl or kl_first_last / ratio_max far
                              above the median of the steps before it
  all_wrong                   most groups all-wrong for `streak` steps in a row
  no_signal                   `streak` steps in a row with (nearly) no group of mixed
                              rewards, or no update at all
  format_only                 the well-formed share rises while correctness stays flat

A trend compares the mean of the last `window` steps with the mean of the run's first
`window` (none fires before 2 x window steps), a spike one step with the median of the
`window` steps before it, a streak counts `streak` steps in a row; the thresholds are the
run's `health` section (`rlvr.run.sections.HealthConfig`). `announce` turns a step's warnings into what a
user sees: a logged line "health: step 7: ...", a metric health_<name> = 1 at that step and
a tracker alert; `replay` gives the warnings of a whole metrics.jsonl (summary.json).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Iterable, Mapping

import numpy as np

_LOG = logging.getLogger(__name__)

# Where a condition's fix is set: named in the messages.
_HARD_FIX = (
  "try more samples per prompt (rl.loop.group_size), a higher temperature "
  "(rl.loop.temperature), easier problems, or a longer warm start (sft.steps)"
)
_EASY_FIX = "the problems are too easy for the policy: give harder ones"
_KL_KEYS = ("kl", "mismatch_kl", "kl_first_last")


@dataclasses.dataclass(frozen=True)
class Warning:
  """One warning: the RL step it started at (0-based, as metrics.jsonl numbers it), its
  condition's name and its line."""

  step: int
  name: str
  message: str

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _finite(v) -> float | None:
  if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
    return None
  v = float(v)
  return v if math.isfinite(v) else None


def _mean(xs) -> float:
  return float(np.mean(xs))


class Monitor:
  """The health of one run, one step at a time.

  cfg: the run's `health` section (`rlvr.run.sections.HealthConfig`). custom_reward: the
  reward is more than the verifier's verdict (shaping, or a reward of the user's), so that
  reward_mean can rise on its own. format_bonus: shaping.format_bonus, which turns the
  `shaping_format` metric into the share of well-formed responses (0: no such metric).
  `warnings` holds every warning so far, in step order.
  """

  def __init__(self, cfg, custom_reward: bool = True, format_bonus: float = 0.0):
    self.cfg = cfg
    self.custom_reward = custom_reward
    self.format_bonus = format_bonus
    self.warnings: list[Warning] = []
    self._series: dict[str, list[float]] = {}  # metric -> its values, in step order
    # the steps of each streak going on (the last `streak` of them)
    self._streaks: dict[str, list[Mapping[str, Any]]] = {"all_wrong": [], "no_signal": []}
    self._active: set[str] = set()
    self._steps = 0

  def observe(self, step: int, metrics: Mapping[str, Any]) -> list[Warning]:
    """The warnings that start at `step`, from its metrics row (also added to `warnings`)."""
    if not self.cfg.enabled:
      return []
    self._steps += 1
    self._record(metrics)
    holding = dict(self._conditions())
    new = [
      Warning(int(step), name, text) for name, text in holding.items() if name not in self._active
    ]
    self._active = set(holding)
    self.warnings.extend(new)
    return new

  # ---------------------------------------------------------------- the series
  def _record(self, m: Mapping[str, Any]) -> None:
    values = {
      k: _finite(m.get(k))
      for k in (
        "reward_mean",
        "accuracy",
        "response_len_mean",
        "truncated_frac",
        "entropy",
        "repeated_3gram_frac",
        "ratio_max",
        *_KL_KEYS,
      )
    }
    # evaluation every N steps: the mean over its sets, on the steps it ran
    for suffix, key in (("_pass@1", "heldout_pass@1"), ("_well_formed", "heldout_well_formed")):
      found = [_finite(v) for k, v in m.items() if k.endswith(suffix)]
      found = [v for v in found if v is not None]
      values[key] = _mean(found) if found else None
    formed = _finite(m.get("shaping_format"))
    if formed is not None and self.format_bonus > 0:
      values["well_formed"] = formed / self.format_bonus
    for k, v in values.items():
      if v is not None:
        self._series.setdefault(k, []).append(v)
    skipped = bool(m.get("skipped_update", 0))
    solve_all, solve_none = (_finite(m.get(k)) for k in ("solve_all", "solve_none"))
    solve_all, solve_none = solve_all or 0.0, solve_none or 0.0
    c = self.cfg
    step = {"skipped": skipped, "solve_all": solve_all, "solve_none": solve_none}
    wrong = solve_none >= c.all_wrong_share
    flat = skipped or solve_all + solve_none >= c.no_signal_share
    for name, holds in (("all_wrong", wrong), ("no_signal", flat)):
      self._streaks[name] = (self._streaks[name] + [step])[-c.streak :] if holds else []

  def _trend(self, key: str) -> tuple[float, float] | None:
    """(mean of the first window, mean of the last window) of a metric logged every step,
    once 2 x window steps are seen; an evaluation's metric (`heldout_*`): of its first and
    last halves (up to a window each), once it has two values."""
    xs, k = self._series.get(key, []), self.cfg.window
    if self._steps < 2 * k:
      return None
    if key.startswith("heldout_"):
      if len(xs) < 2:
        return None
      k = min(k, len(xs) // 2)
    elif len(xs) < 2 * k:
      return None
    return _mean(xs[:k]), _mean(xs[-k:])

  def _correctness(self) -> tuple[str, tuple[float, float]] | None:
    for key in ("heldout_pass@1", "accuracy"):
      t = self._trend(key)
      if t is not None:
        return key, t
    return None

  def _spike(self, key: str, offset: float = 0.0) -> tuple[float, float] | None:
    """(the last value, the median of the window before it), both less `offset`, where the
    last is `spike_factor` times the median or more."""
    xs, k = self._series.get(key, []), self.cfg.window
    if len(xs) < k + 1 or self._steps < k + 1:
      return None
    last, before = xs[-1] - offset, float(np.median(xs[-k - 1 : -1])) - offset
    return (last, before) if last >= self.cfg.spike_factor * max(before, 0.0) else None

  # ------------------------------------------------------------ the conditions
  def _conditions(self) -> Iterable[tuple[str, str]]:
    c = self.cfg
    correct = self._correctness()
    if correct is not None:
      what, (c0, c1) = correct
      flat = c1 - c0 < c.correct_rise
      moved = "fell" if c1 - c0 <= -c.correct_rise else "stayed flat"
      said = f"{what} {moved} ({c0:.2f} -> {c1:.2f})"
      reward = self._trend("reward_mean")
      if self.custom_reward and reward is not None and flat:
        r0, r1 = reward
        if r1 - r0 >= c.reward_rise:
          yield (
            "reward_without_correctness",
            f"reward_mean rose {r0:.3g} -> {r1:.3g} while {said}: the reward pays for "
            "something other than correct answers; read the samples (rl.log_samples_every) "
            "and check the shaping terms or the reward function",
          )
      formed = self._trend("heldout_well_formed") or self._trend("well_formed")
      if formed is not None and flat and formed[1] - formed[0] >= c.format_rise:
        w0, w1 = formed
        yield (
          "format_only",
          f"well-formed answers rose {w0:.0%} -> {w1:.0%} while {said}: the policy learns the "
          "answer format, not the answers; lower shaping.format_bonus, or try easier problems "
          "or a longer warm start (sft.steps)",
        )
    length = self._trend("response_len_mean")
    if length is not None and length[0] > 0:
      l0, l1 = length
      if l1 >= c.length_ratio * l0:
        yield (
          "length_explodes",
          f"response_len_mean grew {l0:.1f} -> {l1:.1f} tokens (x{l1 / l0:.1f}): read the "
          "samples for padding or loops; a reward that pays for length, or too high a "
          "learning rate, does this; the overlong penalty (shaping.overlong_cache) bounds it",
        )
      elif l1 <= l0 / c.length_ratio:
        yield (
          "length_collapses",
          f"response_len_mean fell {l0:.1f} -> {l1:.1f} tokens (x{l1 / l0:.2f}): the policy "
          "stops working its answers out; check the reward for a short-answer shortcut and "
          "the overlong penalty (shaping.overlong_*)",
        )
    trunc = self._trend("truncated_frac")
    if trunc is not None and trunc[1] - trunc[0] >= c.truncated_rise:
      yield (
        "truncation_climbs",
        f"truncated_frac rose {trunc[0]:.0%} -> {trunc[1]:.0%} of responses cut at "
        "rl.loop.max_response_len: raise it, or add the overlong penalty "
        "(shaping.overlong_cache)",
      )
    ent = self._trend("entropy")
    if ent is not None and ent[0] > 0 and ent[1] <= c.entropy_ratio * ent[0]:
      yield (
        "entropy_collapses",
        f"entropy fell {ent[0]:.3g} -> {ent[1]:.3g} (x{ent[1] / ent[0]:.2f} of its start): the "
        "policy samples nearly one response, so groups lose their spread; try a higher "
        "rl.learner.eps_high (clip-higher), a higher rl.loop.temperature or a lower "
        "learning rate",
      )
    rep = self._trend("repeated_3gram_frac")
    if rep is not None and rep[1] - rep[0] >= c.repetition_rise:
      yield (
        "repetition_rises",
        f"repeated_3gram_frac rose {rep[0]:.2f} -> {rep[1]:.2f}: responses repeat themselves; "
        "read the samples; the overlong penalty (shaping.overlong_cache) or a lower "
        "learning rate",
      )
    for key in _KL_KEYS:
      spike = self._spike(key)
      if spike is not None and spike[0] >= c.kl_floor:
        yield (
          "kl_spike",
          f"{key} {spike[0]:.3g}, {spike[0] / max(spike[1], 1e-12):.0f}x the median "
          f"{spike[1]:.3g} of the {c.window} steps before: the policy moved far in one "
          "step; lower the learning rate or rl.learner.grad_clip",
        )
        break
    spike = self._spike("ratio_max", offset=1.0)
    if spike is not None and spike[0] + 1 >= c.ratio_floor:
      yield (
        "ratio_spike",
        f"ratio_max {spike[0] + 1:.3g} against a median of {spike[1] + 1:.3g} over the "
        f"{c.window} steps before: samples far off the policy that learns from them; check "
        "rl.loop.max_staleness and the sampler's weights, or lower the learning rate",
      )
    yield from self._streak_conditions()

  def _streak_conditions(self) -> Iterable[tuple[str, str]]:
    n = self.cfg.streak
    wrong, flat = self._streaks["all_wrong"], self._streaks["no_signal"]
    if len(wrong) >= n:
      share = _mean([s["solve_none"] for s in wrong])
      yield (
        "all_wrong",
        f"most groups all-wrong for {n} steps in a row (solve_none {share:.0%}): the "
        f"problems are too hard for the policy; {_HARD_FIX}",
      )
    elif len(flat) >= n:
      skipped = sum(s["skipped"] for s in flat)
      solve_all, solve_none = (_mean([s[k] for s in flat]) for k in ("solve_all", "solve_none"))
      fix = (
        f"the problems are too hard for the policy; {_HARD_FIX}"
        if solve_none >= solve_all
        else _EASY_FIX
      )
      yield (
        "no_signal",
        f"{n} steps in a row with (nearly) no learning signal ({skipped} updates skipped; of "
        f"the groups sampled, all right {solve_all:.0%}, all wrong {solve_none:.0%}): {fix}",
      )


def announce(warnings: Iterable[Warning], alert: Callable[[str, str], None] | None = None):
  """Each warning as a logged line ("health: step 7: <name>: ...") and, given one,
  `alert(title, text)` (a tracker's: `MetricsWriter.alert`); returns the step's metrics,
  health_<name> = 1 for each."""
  out = {}
  for w in warnings:
    _LOG.warning("health: step %d: %s: %s", w.step, w.name, w.message)
    if alert is not None:
      alert(f"health: {w.name} at step {w.step}", w.message)
    out[f"health_{w.name}"] = 1
  return out


def replay(monitor: Monitor, rows: Iterable[Mapping[str, Any]]) -> list[Warning]:
  """`monitor` fed metrics.jsonl rows in order (a resumed run's earlier steps, or a whole
  run for its summary); returns its warnings."""
  for row in rows:
    monitor.observe(int(row["step"]), row)
  return monitor.warnings
