"""One program run as a tool call: its output, never a verdict against tests.

A policy that calls a python tool mid-solution (`rlvr.envs.python_tool`) runs each block
here, in the same sandbox and under the same limits as a graded program (`bwrap`), and
reads back what it printed. Whatever the program does (hangs, forks, floods its output,
crashes) ends as a `ToolResult` whose `status`, one of `TOOL_STATUSES`, names it (a metric
counts each); nothing it does raises here but a missing or broken sandbox
(`CodeSandboxError`), which a run checks once at start-up.
"""

from __future__ import annotations

import dataclasses
import time

from rlvr.sandbox import bwrap, jobs
from rlvr.sandbox.limits import CodeLimits, CodeSandboxError, clean_text

_STARTUP_S = 15.0  # the judge's own start, on top of the program's wall limit
_SLACK_S = 1.0  # fork, report, kill what is left
TOOL_STATUSES = (
  "ok",
  "timeout",
  "memory",
  "runtime_error",
  "output_limit",
  "judge_error",
  "sandbox_error",
)


@dataclasses.dataclass(frozen=True)
class ToolResult:
  """status: "ok", or why the call failed: "timeout", "memory", "runtime_error" (an
  exception or a non-zero exit; `detail` names it), "output_limit", "judge_error",
  "sandbox_error" (`TOOL_STATUSES`). stdout: what the program printed (also when it failed).
  detail: at most 300 characters, no control characters."""

  status: str
  stdout: str
  detail: str
  seconds: float


def run_python(code: str, limits: CodeLimits, sandbox: str = "bwrap") -> ToolResult:
  """Runs `code` as a script with empty stdin in the sandbox; what it printed and how it ended."""
  t0 = time.monotonic()
  job = jobs.script(code, limits)
  msg = None
  try:
    with bwrap.SandboxedJudge(job, limits, sandbox) as run:
      for m in run.messages(t0 + _STARTUP_S + limits.wall_s + _SLACK_S):
        msg = m
        break
      if msg is None:
        if not run.ready:
          why = run.stderr.decode("utf-8", "replace").strip()[-200:]
          msg = {"status": "sandbox_error", "detail": f"the tool did not start: {why}"}
        elif run.end == "deadline":
          msg = {"status": "timeout", "detail": f"wall limit ({limits.wall_s} s)"}
        else:
          msg = {"status": "runtime_error", "detail": f"the run ended early ({run.end})"}
      elif msg.get("status") == "runtime_error" and run.oom_kills():
        msg = dict(msg, status="memory")
  except CodeSandboxError:
    raise
  except Exception as e:  # noqa: BLE001 - one tool call never ends the run
    msg = {"status": "sandbox_error", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
  status = msg.get("status")
  stdout = msg.get("stdout")
  return ToolResult(
    status if status in TOOL_STATUSES else "runtime_error",
    stdout if isinstance(stdout, str) else "",
    clean_text(msg.get("detail"), 300),
    time.monotonic() - t0,
  )
