"""The reward proven before any training: `check(verifier, cfg, examples)`.

On a sample of the training rows (`reward.preflight_rows`), in seconds:

- **The gold answers score.** Each row's reference answer is written the way the
  instruction asks for a final answer (`\\boxed{...}` or `Answer: ...`, `reward.extraction`;
  for code, the row's own solution (a worked response with its python block, or a bare
  program put in one) where it has one) and scored by the
  run's verifier. A row whose gold does not score (reward <= 0: not correct) is named with
  the verifier's reason; past `reward.preflight_max_bad_gold` of the rows the run stops.
- **Nothing scores for free.** Responses that answer nothing (empty, the problem echoed,
  the question restated, long junk) and format-only ones (`\\boxed{}`, a boxed wrong
  number) are scored on the same rows. A probe that earns as much as the row's gold on at
  least half the rows where the gold scores is a reward that pays without the answer: the
  run stops, naming the probe. A boxed wrong number may earn less than the gold (a format
  credit); one that earns as much is an exploit.

`PreflightError` is the one-line stop; `Report` is what summary.json keeps. Once the
policy has written its first responses (the evaluation before RL), `before_rl` names why,
when every one of them scores the same, from what can be measured.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from rlvr.rewards.config import RewardConfig
from rlvr.rewards.equivalence import is_well_formed

_SHOWN = 3
_JUNK = " ".join(["lorem", "ipsum", "dolor", "sit", "amet", "consectetur"] * 60)


class PreflightError(ValueError):
  """The reward fails its preflight: the run stops before step 1."""


@dataclasses.dataclass
class Report:
  """What the preflight measured: rows sampled, gold answers that scored, each probe's
  mean reward and the rows where it earned as much as the gold, and its seconds."""

  rows: int = 0
  gold_scored: int = 0
  gold_mean: float = 0.0
  bad_gold: list[str] = dataclasses.field(default_factory=list)
  probes: dict[str, dict] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0

  def line(self) -> str:
    worst = max(self.probes.items(), key=lambda kv: kv[1]["mean_reward"], default=None)
    probe = (
      f"; the best-paid probe, {worst[0]}, earns {worst[1]['mean_reward']:.3g}" if worst else ""
    )
    return (
      f"reward preflight: {self.gold_scored} of {self.rows} gold answers score "
      f"(mean {self.gold_mean:.3g}){probe} ({self.seconds:.1f} s)"
    )


def gold_response(cfg: RewardConfig, example) -> str | None:
  """A response that states `example`'s reference answer as the instruction asks; None
  when there is none to write (a code problem without a solution)."""
  if cfg.domain == "code":
    solution = example.solution or example.columns.get("canonical_solution")
    if not isinstance(solution, str) or not solution.strip():
      return None
    return solution if "```" in solution else f"```python\n{solution}\n```"  # a worked one
  if cfg.extraction == "answer_line":
    return f"Answer: {example.answer}"
  return f"The answer is \\boxed{{{example.answer}}}."


def _wrong_number(answer: str) -> str:
  try:
    return str(int(answer.strip()) + 1)
  except ValueError:
    return "0" if answer.strip() != "0" else "1"


def probes(cfg: RewardConfig, example) -> dict[str, str]:
  """Responses that must not earn what the gold answer earns."""
  boxed = (
    (lambda x: f"Answer: {x}") if cfg.extraction == "answer_line" else (lambda x: f"\\boxed{{{x}}}")
  )
  return {
    "the empty response": "",
    "the problem echoed": example.problem,
    "the question restated": f"The question asks: {example.problem} Let me restate it.",
    "long junk": _JUNK,
    "an empty final answer": boxed(""),
    "a wrong final answer": f"The answer is {boxed(_wrong_number(example.answer))}.",
  }


def _sample(examples: Sequence, n: int) -> list:
  """n rows spread over the set (all of them when it has no more)."""
  if len(examples) <= n:
    return list(examples)
  picks = np.linspace(0, len(examples) - 1, n).round().astype(int)
  return [examples[i] for i in dict.fromkeys(picks.tolist())]


def _reason(cfg: RewardConfig, note: dict, reward: float) -> str:
  for key in ("verdict", "reason"):  # a user's function, a program's
    if note.get(key) and note[key] not in ("scored", "passed"):
      return str(note[key]) + (f": {note['detail']}" if note.get("detail") else "")
  if "extracted" in note:
    if note["extracted"] is None:
      return "no final answer could be read from it"
    if cfg.integer_answers and not is_well_formed(note["extracted"], True):
      return "not an integer (reward.integer_answers=True)"
    return f"the verifier does not match {note['extracted']!r} to itself"
  return f"it scores {reward:g}"


def check(verifier, cfg: RewardConfig, examples: Sequence, name: str = "data.train_path") -> Report:
  """The preflight of `verifier` (the run's, `rlvr.rewards.verifiers`) on `examples`;
  raises PreflightError in one line when the reward cannot be trained on."""
  start = time.monotonic()
  rows = _sample(examples, cfg.preflight_rows)
  report = Report(rows=len(rows))
  if not rows:
    return report
  gold_rows = [(e, gold_response(cfg, e)) for e in rows]
  gold_rows = [(e, g) for e, g in gold_rows if g is not None]
  gold = {}
  if gold_rows:
    texts = [g for _, g in gold_rows]
    rewards, correct, notes = verifier.judge(
      texts, [e.answer for e, _ in gold_rows], [e.problem for e, _ in gold_rows]
    )
    rewards = np.asarray(rewards, np.float64)
    for (e, text), r, c, note in zip(gold_rows, rewards, correct, notes):
      formed = verifier.well_formed(text)  # a gold that matches only itself as a string
      gold[id(e)] = float(r) if c and formed else None
      if not c:
        report.bad_gold.append(f"{e.where()} ({e.answer!r}): {_reason(cfg, note, float(r))}")
      elif not formed:
        why = (
          "not an integer (reward.integer_answers=True)"
          if cfg.integer_answers
          else ("it states no final answer the verifier can check")
        )
        report.bad_gold.append(f"{e.where()} ({e.answer!r}): {why}")
    report.gold_scored = sum(g is not None for g in gold.values())
    report.gold_mean = float(rewards.mean())
    bad = len(report.bad_gold)
    if bad and bad > cfg.preflight_max_bad_gold * len(gold_rows):
      shown = "; ".join(report.bad_gold[:_SHOWN])
      more = f"; ... {bad - _SHOWN} more" if bad > _SHOWN else ""
      raise PreflightError(
        f"reward.preflight: {bad} of {len(gold_rows)} gold answers of {name} do not score "
        f"when written as the instruction asks ({gold_rows[0][1]!r}): {shown}{more}; fix "
        "those rows or the reward (reward.domain, reward.extraction, reward.integer_answers), "
        "or set reward.preflight=False to train anyway"
      )
  per_probe = [probes(cfg, e) for e in rows]
  kinds = list(per_probe[0])
  texts = [p[k] for k in kinds for p in per_probe]
  golds = [e.answer for _ in kinds for e in rows]
  problems = [e.problem for _ in kinds for e in rows]
  rewards, _, _ = verifier.judge(texts, golds, problems)
  rewards = np.asarray(rewards, np.float64).reshape(len(kinds), len(rows))
  scored = [gold.get(id(e)) for e in rows]
  for kind, got in zip(kinds, rewards):
    paid = [i for i, g in enumerate(scored) if g is not None and got[i] >= g]
    report.probes[kind] = {"mean_reward": float(got.mean()), "as_much_as_gold": len(paid)}
  report.seconds = time.monotonic() - start
  with_gold = sum(g is not None for g in scored)
  for kind, p in report.probes.items():
    if with_gold and p["as_much_as_gold"] * 2 >= with_gold:
      example = per_probe[0][kind]
      shown = repr(example if len(example) <= 40 else example[:40] + "...")
      raise PreflightError(
        f"reward.preflight: {kind} ({shown}) earns as much as the gold answer on "
        f"{p['as_much_as_gold']} of {with_gold} rows (mean reward {p['mean_reward']:.3g}): "
        f"reward.domain {cfg.domain} pays without the answer, and RL would learn that; fix "
        "the reward, or set reward.preflight=False to train anyway"
      )
  return report


def before_rl(results: dict[str, dict], max_tokens: int) -> str | None:
  """When every response of the evaluation before RL scored alike (all wrong, or all
  right), one line saying why from what was measured and what to try; else None.
  `results`: per eval set, its `pass@1`, `truncated` and (when measured) `well_formed`
  shares, as the run's summary keeps them."""
  rates = {name: r["pass@1"] for name, r in results.items()}
  if not rates or not (all(v == 0 for v in rates.values()) or all(v == 1 for v in rates.values())):
    return None
  shown = ", ".join(f"{name} {100 * v:.1f}%" for name, v in rates.items())
  if all(v == 1 for v in rates.values()):
    return (
      f"reward preflight: before RL every held-out response is right ({shown}): no group "
      "will have a learning signal; give harder problems"
    )
  n = len(results)
  cut = sum(r.get("truncated", 0.0) for r in results.values()) / n
  formed = [r["well_formed"] for r in results.values() if "well_formed" in r]
  parts, tries = [], []
  if formed:
    no_answer = 1 - sum(formed) / len(formed)
    parts.append(f"{100 * no_answer:.0f}% state no final answer in the form the reward reads")
    parts.append(f"{100 * (1 - no_answer):.0f}% state one that is wrong")
    if no_answer > 0:
      tries.append(
        "a warm start that teaches the answer format (sft.steps on worked solutions), or "
        "data.instruction / reward.extraction that match what the model writes"
      )
  parts.append(f"{100 * cut:.0f}% were cut at eval.sampling.max_tokens={max_tokens}")
  if cut > 0:
    tries.append("a longer rl.loop.max_response_len (and eval.sampling.max_tokens)")
  tries.append(
    "easier problems, more samples per prompt (rl.loop.group_size) or a higher "
    "temperature (rl.loop.temperature) so that some groups hold a right answer"
  )
  return (
    f"reward preflight: before RL every held-out response scores 0 ({shown}): "
    + ", ".join(parts)
    + "; try "
    + "; ".join(tries)
  )
