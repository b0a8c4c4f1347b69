"""Run health while it trains (`rlvr.report.health`): the Monitor on synthetic metric
sequences, where each condition starts, clears and starts again at a known step; the line,
metric and wandb alert a warning makes; the repetition metric; and two launch.train runs, one
with a reward that pays for length (warned at the steps its own metrics say the trouble
starts, listed in summary.json) and one with the verifier's reward (no warning)."""

from __future__ import annotations

import json
import logging
import textwrap

import numpy as np
import pytest
import run_copies
import test_tracking
import tiny_run

from rlvr.common import settings
from rlvr.report import health, metrics
from rlvr.rollout import stats
from rlvr.run import experiment, sections

offline = test_tracking.offline  # wandb in offline mode (fixture)

HEALTHY = {
  "reward_mean": 0.3,
  "accuracy": 0.3,
  "response_len_mean": 100.0,
  "truncated_frac": 0.0,
  "entropy": 1.0,
  "repeated_3gram_frac": 0.05,
  "ratio_max": 1.1,
  "mismatch_kl": 1e-3,
  "solve_all": 0.1,
  "solve_none": 0.3,
  "skipped_update": 0,
}


def _rows(n: int, **changes) -> list[dict]:
  """n healthy rows; changes: metric -> {step: value} (held from that step on) or a list."""
  rows = []
  for step in range(n):
    row = dict(HEALTHY, step=step)
    for key, given in changes.items():
      if isinstance(given, list):
        row[key] = given[step]
      else:
        held = [v for s, v in sorted(given.items()) if s <= step]
        if held:
          row[key] = held[-1]
    rows.append(row)
  return rows


def _fired(rows, custom_reward: bool = True, format_bonus: float = 0.0, **cfg) -> dict:
  """name -> the steps its warnings started at, feeding `rows` one step at a time."""
  monitor = health.Monitor(sections.HealthConfig(**cfg), custom_reward, format_bonus)
  for row in rows:
    for w in monitor.observe(row["step"], row):
      assert w.step == row["step"]
  out = {}
  for w in monitor.warnings:
    out.setdefault(w.name, []).append(w.step)
  return out


def test_length_and_reward_warn_where_they_start_once_per_episode():
  """window 3: the trailing mean of steps 5..7 is the first over 2x the first three steps'
  length (step 7); the reward's first trailing mean 0.1 above its start is at step 6. The
  length clears at step 13 and starts again at step 19; the reward never clears-and-starts."""
  length = {6: 300.0, 12: 100.0, 18: 300.0}
  rows = _rows(24, response_len_mean=length, reward_mean={6: 0.8, 12: 0.3})
  assert _fired(rows, window=3) == {"length_explodes": [7, 19], "reward_without_correctness": [6]}
  # the verifier's own reward is correctness: only the length
  assert _fired(rows, custom_reward=False, window=3) == {"length_explodes": [7, 19]}
  monitor = health.Monitor(sections.HealthConfig(window=3))
  said = [w.message for row in rows for w in monitor.observe(row["step"], row)]
  assert said[0].startswith("reward_mean rose 0.3 -> 0.467 while accuracy stayed flat (0.30 ")
  assert "the reward pays for something other than correct answers" in said[0]
  assert said[1].startswith("response_len_mean grew 100.0 -> 233.3 tokens (x2.3): ")


def test_nothing_fires_in_the_first_steps_or_in_a_healthy_run():
  wild = _rows(5, response_len_mean=[10.0, 500.0, 500.0, 500.0, 500.0], entropy={1: 0.01})
  assert _fired(wild, window=3) == {}  # 2 x window steps are needed
  rng = np.random.default_rng(0)
  n = 80
  acc = np.linspace(0.2, 0.5, n) + rng.normal(0, 0.02, n)
  rows = _rows(
    n,
    accuracy=list(acc),
    reward_mean=list(acc),  # a verifier's reward pays for correctness only
    response_len_mean=list(100 * (1 + 0.5 * np.linspace(0, 1, n)) + rng.normal(0, 8, n)),
    entropy=list(np.linspace(1.0, 0.6, n)),
    truncated_frac=list(rng.uniform(0, 0.05, n)),
    ratio_max=list(rng.uniform(1.0, 1.3, n)),
    mismatch_kl=list(rng.uniform(5e-4, 1.5e-3, n)),
  )
  assert _fired(rows) == {}
  assert _fired(rows, custom_reward=False) == {}


def test_reward_rising_while_held_out_pass_at_1_falls():
  """With evaluations every 5 steps (their sets' pass@1 on steps 4, 9, 14), correctness is
  held-out pass@1 once it has two values, though training accuracy rises with the reward."""
  rising = list(np.linspace(0.3, 0.7, 15))
  rows = _rows(15, reward_mean=rising, accuracy=rising)
  for step, value in ((4, 0.5), (9, 0.3), (14, 0.2)):
    rows[step].update({"math_pass@1": value, "aime_pass@1": value, "math_pass@4": 0.9})
  monitor = health.Monitor(sections.HealthConfig(window=3))
  fired = [w for row in rows for w in monitor.observe(row["step"], row)]
  assert [(w.step, w.name) for w in fired] == [(9, "reward_without_correctness")]
  assert "while heldout_pass@1 fell (0.50 -> 0.30)" in fired[0].message


@pytest.mark.parametrize(
  "changes,name,step,words",
  [
    ({"truncated_frac": {6: 0.5}}, "truncation_climbs", 7, "rl.loop.max_response_len"),
    ({"response_len_mean": {6: 20.0}}, "length_collapses", 7, "fell 100.0 -> 46.7 tokens"),
    ({"entropy": {6: 0.05}}, "entropy_collapses", 8, "rl.learner.eps_high"),
    ({"repeated_3gram_frac": {6: 0.6}}, "repetition_rises", 6, "repeat themselves"),
    ({"mismatch_kl": {6: 0.05, 7: 1e-3}}, "kl_spike", 6, "mismatch_kl 0.05, 50x the median"),
    ({"ratio_max": {5: 4.0, 6: 1.1}}, "ratio_spike", 5, "ratio_max 4 against a median of 1.1"),
    ({"solve_none": {2: 0.9}}, "all_wrong", 5, "more samples per prompt (rl.loop.group_size)"),
    ({"solve_all": {2: 0.95}, "solve_none": {2: 0.0}}, "no_signal", 5, "give harder ones"),
    ({"skipped_update": {2: 1}}, "no_signal", 5, "4 updates skipped"),
  ],
)
def test_each_condition_fires_at_its_step(changes, name, step, words):
  monitor = health.Monitor(sections.HealthConfig(window=3, streak=4))
  fired = [w for row in _rows(12, **changes) for w in monitor.observe(row["step"], row)]
  assert [(w.step, w.name) for w in fired] == [(step, name)]
  assert words in fired[0].message, fired[0].message


def test_all_wrong_names_every_fix_and_spikes_warn_again_after_clearing():
  rows = _rows(12, solve_none={0: 1.0})
  monitor = health.Monitor(sections.HealthConfig(streak=4))
  fired = [w for row in rows for w in monitor.observe(row["step"], row)]
  assert [(w.step, w.name) for w in fired] == [(3, "all_wrong")]  # one episode, 12 steps
  for fix in ("rl.loop.group_size", "rl.loop.temperature", "easier problems", "sft.steps"):
    assert fix in fired[0].message
  spikes = _rows(12, mismatch_kl={6: 0.05, 7: 1e-3, 9: 0.05, 10: 1e-3})
  assert _fired(spikes, window=3) == {"kl_spike": [6, 9]}


def test_format_only_from_the_shaping_bonus_metric():
  """shaping.format_bonus 0.1: shaping_format 0.01 -> 0.09 is 10% -> 90% well-formed."""
  rows = _rows(12, shaping_format={0: 0.01, 6: 0.09}, accuracy={0: 0.0}, reward_mean={0: 0.0})
  monitor = health.Monitor(sections.HealthConfig(window=3), format_bonus=0.1)
  fired = [w for row in rows for w in monitor.observe(row["step"], row)]
  assert [(w.step, w.name) for w in fired] == [(6, "format_only")]
  assert fired[0].message.startswith("well-formed answers rose 10% -> 37% while accuracy ")
  assert _fired(rows, window=3) == {}  # without the bonus the metric is no share


def test_a_resumed_monitor_goes_on_where_the_first_stopped():
  rows = _rows(24, response_len_mean={6: 300.0, 12: 100.0, 18: 300.0})
  live = health.replay(health.Monitor(sections.HealthConfig(window=3)), rows)
  resumed = health.Monitor(sections.HealthConfig(window=3))
  health.replay(resumed, rows[:9])  # stopped after step 8, inside the first episode
  later = [w for row in rows[9:] for w in resumed.observe(row["step"], row)]
  assert [w.step for w in later] == [19] and resumed.warnings == live
  off = health.Monitor(sections.HealthConfig(enabled=False, window=3))
  assert health.replay(off, rows) == []


def test_a_warning_is_a_line_a_metric_and_an_alert(caplog):
  alerts = []
  w = health.Warning(7, "length_explodes", "response_len_mean grew")
  with caplog.at_level(logging.WARNING, logger="rlvr.report.health"):
    got = health.announce([w], lambda title, text: alerts.append((title, text)))
  assert got == {"health_length_explodes": 1}
  assert caplog.messages == ["health: step 7: length_explodes: response_len_mean grew"]
  assert alerts == [("health: length_explodes at step 7", "response_len_mean grew")]
  assert w.as_dict() == {"step": 7, "name": "length_explodes", "message": "response_len_mean grew"}


def test_the_alert_reaches_wandb(tmp_path, offline):
  cfg = sections.LoggingConfig(wandb=True, wandb_project="health-test")
  writer = metrics.MetricsWriter(str(tmp_path / "run"), resume_step=0, logging=cfg)
  writer.write(0, {"reward_mean": 0.5})
  writer.alert("health: length_explodes at step 7", "response_len_mean grew")
  test_tracking._close(writer)
  (run_file,) = test_tracking._run_files(offline)
  alerts = [r.alert for r in test_tracking._records(run_file) if r.HasField("alert")]
  assert [(a.title, a.text, a.level) for a in alerts] == [
    ("health: length_explodes at step 7", "response_len_mean grew", "WARN")
  ]
  plain = metrics.MetricsWriter(str(tmp_path / "plain"), logging=sections.LoggingConfig())
  plain.alert("no tracker", "nothing happens")
  plain.close()


def test_repeated_3gram_frac_counts_exact_repeats():
  assert stats.repeated_3gram_frac([1, 2, 3, 1, 2, 3, 1, 2, 3]) == pytest.approx(4 / 7)
  assert stats.repeated_3gram_frac(range(50)) == 0.0
  assert stats.repeated_3gram_frac([5, 5, 5]) == 0.0  # one 3-gram
  assert stats.repeated_3gram_frac([7] * 12) == pytest.approx(9 / 10)
  top = 2**21 - 1  # ids up to 21 bits stay apart
  assert stats.repeated_3gram_frac([top, 0, top, 0, 1, top]) == 0.0


def test_health_section_defaults_and_bad_values():
  checked = experiment.check(tiny_run.config("tiny_rlvr", "--config.health.window=4"))
  assert checked.health == sections.HealthConfig(window=4)
  for field, value, said in (
    ("window", 0, "health.window / streak: must be >= 1"),
    ("entropy_ratio", 1.5, "health.entropy_ratio: must be in (0, 1]"),
    ("length_ratio", 1.0, "health.length_ratio / spike_factor / ratio_floor: must be > 1"),
  ):
    with pytest.raises(ValueError, match="^" + said.replace("(", r"\(").replace("]", r"\]")):
      settings.frozen(sections.HealthConfig, {field: value}, prefix="health.")


# ------------------------------------------------------------------ launch.train
LENGTH_REWARD = """
import re

import numpy as np


class PaysForLength:
  \"\"\"A verifier whose reward is a response's length (characters / 100) and whose
  correctness is the math: the response's last integer is the answer.\"\"\"

  def __init__(self, cfg):
    self.cfg = cfg

  def score(self, texts, golds, prompts=None):
    rewards = np.array([len(t) / 100 for t in texts], np.float32)
    correct = np.array([re.findall(r"-?[0-9]+", t)[-1:] == [g] for t, g in zip(texts, golds)])
    return rewards, correct

  def judge(self, texts, golds, prompts=None):
    return (*self.score(texts, golds), [{}] * len(texts))

  def well_formed(self, text):
    return bool(re.search(r"[0-9]", text))

  def for_eval(self):
    return self

  def check_answers(self, examples, name):
    pass
"""

# A short SFT teaches the tiny model to stop (~17 tokens), so RL has room to lengthen its
# responses within a few steps. The two runs differ only in their reward; window 1: each
# step against step 0, from step 1 on.
RUN = [
  *(f for f in tiny_run.RAW_PROMPTS_RUN if "sft" not in f and "max_response_len" not in f),
  "--config.sft.steps=40",
  "--config.data.arithmetic.n_sft=64",
  "--config.sft.batch_size=8",
  "--config.rl.loop.max_response_len=48",
  "--config.rl.learner.learning_rate=3e-4",
  "--config.rl.steps=8",
  "--config.reward.preflight=False",
  "--config.health.window=1",
]


def _first(rows, holds) -> int | None:
  """The first step from step 1 whose row against step 0's `holds`."""
  return next((r["step"] for r in rows[1:] if holds(rows[0], r)), None)


def test_a_reward_for_length_warns_where_the_run_goes_wrong_the_verifier_does_not(tmp_path):
  """The steps the warnings start at are read off the run's own metrics.jsonl (timing in
  detail: the synthetic tests above); the verifier's reward gets none (its policy solves
  nothing yet, but 8 steps are fewer than the all_wrong streak of 10)."""
  (tmp_path / "length_reward.py").write_text(textwrap.dedent(LENGTH_REWARD))
  flags = [*RUN, "--config.reward.domain=length_reward:PaysForLength"]
  out, rows = tiny_run.train(tmp_path / "paid", *flags, environ=tiny_run.env(tmp_path))
  summary = json.loads((tmp_path / "paid" / "summary.json").read_text())
  fired = {}
  for w in summary["health"]:
    fired.setdefault(w["name"], w["step"])
  length = _first(rows, lambda a, b: b["response_len_mean"] >= 2 * a["response_len_mean"])
  reward = _first(
    rows,
    lambda a, b: (
      b["reward_mean"] - a["reward_mean"] >= 0.1 and b["accuracy"] - a["accuracy"] < 0.02
    ),
  )
  seen = [(r["reward_mean"], r["accuracy"], r["response_len_mean"]) for r in rows]
  assert length is not None and reward is not None, seen
  assert fired["length_explodes"] == length and fired["reward_without_correctness"] == reward
  for w in summary["health"]:  # the line, the metric at its step, the summary's entry
    assert f"health: step {w['step']}: {w['name']}: {w['message']}" in out
    assert rows[w["step"]][f"health_{w['name']}"] == 1
  flagged = [(r["step"], k[len("health_") :]) for r in rows for k in r if k.startswith("health_")]
  assert flagged == [(w["step"], w["name"]) for w in summary["health"]]

  # The same SFT (its settings do not name the reward): the verified run starts from it.
  run_copies.start_from_sft(tmp_path / "paid", tmp_path / "verified", evaluated=False)
  out, rows = tiny_run.train(tmp_path / "verified", *RUN)
  summary = json.loads((tmp_path / "verified" / "summary.json").read_text())
  assert summary["health"] == [] and "health: step" not in out
  assert not any(k.startswith("health_") for r in rows for k in r)
