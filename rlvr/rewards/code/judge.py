"""Programs against their tests, in the sandbox: `run_tests` (one) and `score` (many)."""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from typing import Sequence

import numpy as np

from rlvr.rewards.code.config import CodeRewardConfig, CodeScore, Verdict
from rlvr.rewards.code.extract import extract_program
from rlvr.rewards.code.formats import TestSpec, parse_tests
from rlvr.sandbox import bwrap
from rlvr.sandbox.cgroups import memory_bound
from rlvr.sandbox.limits import CodeLimits, CodeSandboxError, clean_text

_LOG = logging.getLogger(__name__)
_STARTUP_S = 15.0  # the judge's own start, on top of the cases' wall limits
_CASE_SLACK_S = 1.0  # per case: fork, reporting, killing what is left
# How a run that stopped before its last case failed the cases it did not report.
_ENDS = {
  "deadline": ("timeout", "the run passed its overall time limit"),
  "overflow": ("output_limit", "a report line passed its cap"),
  "bad": ("runtime_error", "the judge's report was malformed"),
  "eof": ("runtime_error", "the judge ended before the last test"),
  "done": ("runtime_error", "the judge reported fewer tests than it was given"),
  "deep": ("judge_error", "a report line nested too deep to read"),
}


def run_tests(
  program: str | None,
  tests,
  limits: CodeLimits | None = None,
  *,
  sandbox: str = "bwrap",
  float_tol: float = 0.0,
  stop_early: bool = False,
) -> Verdict:
  """Runs `program` on `tests` (any format of `formats`) in one sandbox; its `Verdict`.

  Each test case runs in a fresh process under `limits`. With `stop_early` the run ends at
  the first failure (what a binary reward needs). Raises CodeSandboxError when the sandbox
  is missing or broken (never runs the code some other way).
  """
  spec = parse_tests(tests)
  if program is None or not program.strip():
    return Verdict(0, spec.total, "no_code", "no program in the response")
  limits = limits or CodeLimits()
  bwrap.check_sandbox(sandbox)
  passed, seen, failure = 0, 0, None
  deadline = time.monotonic() + _STARTUP_S + spec.total * (limits.wall_s + _CASE_SLACK_S)
  with bwrap.SandboxedJudge(spec.job(program, limits), limits, sandbox) as run:
    for msg in run.messages(deadline):
      if msg.get("case") != seen:
        run.end = "bad"
        break
      ok, reason, detail = _judge_case(spec, seen, msg, float_tol)
      seen += 1
      passed += ok
      if not ok and failure is None:
        failure = (reason, f"test {seen - 1}: {detail}")
        if stop_early:
          break
    if failure is None and seen < spec.total:
      failure = _unfinished(run)
    if failure is not None and failure[0] == "runtime_error" and run.oom_kills():
      bound = memory_bound(limits) >> 20
      failure = ("memory", f"{failure[1]} (the run reached its memory bound, {bound} MiB)")
  if failure is None:
    return Verdict(passed, spec.total, "ok")
  return Verdict(passed, spec.total, failure[0], clean_text(failure[1], 500))


def _judge_case(spec: TestSpec, index: int, msg: dict, float_tol: float) -> tuple[bool, str, str]:
  """`spec.judge`, where a result the host cannot compare (too deep, too large) fails the
  case as "judge_error" instead of raising."""
  try:
    return spec.judge(index, msg, float_tol)
  except Exception as e:  # noqa: BLE001 - whatever the response returned, it is one verdict
    return False, "judge_error", f"{type(e).__name__}: {str(e)[:200]}"


def _unfinished(run: bwrap.SandboxedJudge) -> tuple[str, str]:
  """(reason, detail) of a run whose report stopped early."""
  if not run.ready:
    why = run.stderr.decode("utf-8", "replace").strip()[-300:]
    return "sandbox_error", f"the judge did not start ({run.end}): {why}"
  return _ENDS[run.end]


def score(
  responses: Sequence[str], tests_list: Sequence, cfg: CodeRewardConfig = CodeRewardConfig()
) -> CodeScore:
  """Rewards of `responses`, each run against its tests, `cfg.workers` sandboxes at a time.

  Reward 1 when every test passes (0 otherwise), or the fraction passed with
  `cfg.pass_fraction`. A response longer than `cfg.max_response_chars` is not parsed
  ("too_long"). Checks the sandbox before running anything.
  """
  if isinstance(responses, str):
    raise TypeError("responses: expected a sequence of strings, got a single str")
  if len(responses) != len(tests_list):
    raise ValueError(
      f"responses / tests_list: lengths differ ({len(responses)} vs {len(tests_list)})"
    )
  specs = [parse_tests(t) for t in tests_list]
  bwrap.check_sandbox(cfg.sandbox)

  def one(args: tuple[str, TestSpec]) -> Verdict:
    response, spec = args
    try:
      if len(response) > cfg.max_response_chars:
        n = cfg.max_response_chars
        return Verdict(0, spec.total, "too_long", f"more than max_response_chars={n} characters")
      return run_tests(
        extract_program(response, cfg.extraction),
        spec,
        cfg.limits,
        sandbox=cfg.sandbox,
        float_tol=cfg.float_tol,
        stop_early=not cfg.pass_fraction,
      )
    except Exception as e:  # noqa: BLE001 - nothing one response holds ends the batch
      host = isinstance(e, (OSError, CodeSandboxError))  # could not run it
      reason = "sandbox_error" if host else "judge_error"
      _LOG.warning("code reward: a response scored 0 (%s)", reason, exc_info=True)
      return Verdict(0, spec.total, reason, clean_text(f"{type(e).__name__}: {e}", 300))

  with concurrent.futures.ThreadPoolExecutor(cfg.workers, "rlvr-code") as pool:
    verdicts = list(pool.map(one, zip(responses, specs)))
  correct = np.array([v.reason == "ok" for v in verdicts], bool)
  if cfg.pass_fraction:
    rewards = np.array([v.passed / v.total for v in verdicts], np.float32)
  else:
    rewards = correct.astype(np.float32)
  reasons = dict(collections.Counter(v.reason for v in verdicts))
  for reason, where in (
    ("sandbox_error", "in the sandbox itself"),
    ("judge_error", "to be judged"),
  ):
    if reasons.get(reason):
      _LOG.warning(
        "code reward: %d of %d runs failed %s (scored 0)", reasons[reason], len(verdicts), where
      )
  return CodeScore(rewards=rewards, correct=correct, verdicts=verdicts, reasons=reasons)
