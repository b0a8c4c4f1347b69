"""What a run says about itself: each RL step's record (`StepLog`: metrics.jsonl, health
warnings, samples, the progress bar), the one-line errors of a step that was not finite or
of a run without signal, and summary.json with its plots."""

from __future__ import annotations

import os

from rlvr import rollout
from rlvr.data import tokens
from rlvr.parallel import distributed
from rlvr.report import health, plots, samples_log
from rlvr.report import metrics as metrics_lib
from rlvr.rewards.verifiers import VERIFIERS
from rlvr.run import evaluation, experiment
from rlvr.run import workdir as workdir_lib
from rlvr.run.workdir import Run


class StepLog:
  """What a run records of each RL step from `start` on: a row of metrics.jsonl (and the
  trackers), the health warnings of the row (a line, a metric and an alert per episode of
  trouble; a resumed run's earlier rows replayed so none warns twice), the responses on the
  steps rl.log_samples_every names (workdir/samples/step_<k>.jsonl), the progress bar, and
  whether any step had a learning signal (`check_signal`)."""

  def __init__(self, run: Run, method, start: int):
    from tqdm import tqdm

    s, writes = run.settings, distributed.is_writer()
    self.run, self.method, self.start, self.steps = run, method, start, s.rl_steps
    self.writer = metrics_lib.MetricsWriter(
      run.workdir, resume_step=start, enabled=writes, logging=s.logging, config=s.written
    )
    self.monitor = health_monitor(s)
    if writes:
      health.replay(self.monitor, metrics_lib.read_jsonl(self.writer.path))
    self.samples = samples_log.SamplesLog(
      run.workdir,
      s.rl_log_samples_every,
      resume_step=start,
      decode=lambda ids: tokens.decode_marked(run.tokenizer, ids),
      show=lambda step, rows: self.writer.write_table(step, "samples", rows),
      enabled=writes,
    )
    if start >= self.steps:  # a rerun of a finished run: no bar of the steps done before
      print(f"RL: done before, all {self.steps} steps (checkpoints under {run.workdir})")
    self.bar = tqdm(
      range(start, self.steps),
      desc=method.name,
      unit="step",
      initial=start,
      total=self.steps,
      disable=start >= self.steps,
    )
    self.skipped, self.solved = 0, []

  def write(self, step: int, m: dict) -> None:
    """The step's row, its health warnings added to it."""
    self.skipped += m.get("skipped_update", 0)
    self.solved.append((m.get("solve_all", 0.0), m.get("solve_none", 0.0)))
    if distributed.is_writer():
      m.update(health.announce(self.monitor.observe(step, m), self.writer.alert))
    self.writer.write(step, m)
    self.bar.set_postfix(progress_line(m, self.method))

  def close(self) -> None:
    self.writer.close()

  def check_signal(self) -> None:
    """NoSignalError when every step of this invocation skipped its update."""
    if self.start < self.steps and self.skipped == self.steps - self.start:
      raise rollout.NoSignalError(no_update_message(self.solved, self.run.workdir))


def progress_line(m: dict, method) -> dict:
  """The progress bar's figures of a step's metrics: accuracy, entropy, groups kept and the
  method's own (`method.progress_keys`)."""
  post = {
    "acc": f"{m.get('accuracy', float('nan')):.2f}",
    "ent": f"{m.get('entropy', 0):.2f}",
    "kept": m.get("groups_kept", 0),
  }
  post.update({label: m.get(key, 0) for label, key in method.progress_keys.items()})
  return post


def health_monitor(s: experiment.Settings) -> health.Monitor:
  """The run's health warnings (the `health` section, docs/health.md); reward against
  correctness where the reward is more than the verifier's verdict (shaping, a custom one)."""
  custom = s.shaping.active or s.reward.domain not in VERIFIERS
  return health.Monitor(s.health, custom_reward=custom, format_bonus=s.shaping.format_bonus)


def nonfinite_message(error: Exception, step: int, steps: int, mngr) -> str:
  """The error of an RL step (0-based `step`) whose update had a loss or gradient that was
  not finite (`learner.NonFiniteError`): the step, the learner's line, the newest
  checkpoint (saved before it: no checkpoint holds this step's state)."""
  last = mngr.latest_step()
  where = str(mngr.directory)
  kept = (
    f"the last good checkpoint is step {last} in {where}"
    if last is not None
    else f"no checkpoint was saved before it (in {where})"
  )
  return f"RL step {step + 1} of {steps}: {error}; nothing of this step was saved, {kept}"


def no_update_message(solved, workdir: str) -> str:
  """The error of an invocation whose every RL step skipped its update; solved: the
  (solve_all, solve_none) of each of its steps."""
  solve_all, solve_none = (sum(x) / len(solved) for x in zip(*solved))
  return (
    f"every one of the {len(solved)} RL steps skipped its update: no group had a learning "
    f"signal (reward variance; solve_all {solve_all:.0%}, solve_none {solve_none:.0%}); "
    f"{rollout.no_signal_fix(solve_all, solve_none)}; see {workdir}/metrics.jsonl"
  )


def write_summary(run: Run, method, seconds: float, phases_s: dict | None = None) -> dict:
  """Plots and summary.json from the metrics of all invocations; phases_s: this
  invocation's seconds per phase (`Trainer.timed`)."""
  rows = metrics_lib.read_jsonl(os.path.join(run.workdir, "metrics.jsonl"))
  name = os.path.basename(run.workdir)
  if rows and distributed.is_writer():
    plots.plot_metrics(
      rows,
      plots.TRAINING_PANELS,
      os.path.join(run.workdir, "training.png"),
      title=name,
      before=run.progress.get("eval_before"),
      after=run.progress.get("eval_after"),
    )
    if method.plot_keys:
      mark = method.mark_key
      plots.plot_metrics(
        rows,
        method.plot_keys,
        os.path.join(run.workdir, f"{method.name}.png"),
        title=f"{name}: {method.name}",
        marks=[r["step"] + 1 for r in rows if mark and r.get(mark)],
      )
  reports = {
    label: os.path.join(run.workdir, f"eval_{tag}", "eval.json")
    for label, tag in (("before RL", "before_rl"), ("after RL", "after_rl"))
  }
  if distributed.is_writer() and all(os.path.exists(p) for p in reports.values()):
    evaluation.plot_comparison(
      {label: workdir_lib.json_file(p) for label, p in reports.items()},
      os.path.join(run.workdir, "pass_at_k.png"),
      name,
    )
  summary = {
    "steps": run.settings.rl_steps,
    "eval_before_rl": run.progress["eval_before"],
    "eval_after_rl": run.progress["eval_after"],
    "time_s_this_invocation": round(seconds, 1),
    "phases_s": phases_s or {},
    "method": method.name,
    "preflight": run.progress.get("preflight"),
    "health": [w.as_dict() for w in health.replay(health_monitor(run.settings), rows)],
    "model_dir": run.model_dir,
    "workdir": run.workdir,
    **method.summary(rows),
  }
  return workdir_lib.json_file(os.path.join(run.workdir, "summary.json"), summary)
