"""The execution sandbox: model-written programs run here and nowhere else.

`bwrap` starts the judge (`driver`, standard library only) under bubblewrap with its own
cgroups (`cgroups`) and system call filter (`seccomp`) and reads its report; `jobs` is what
the judge is asked to run; `limits` what a program may use (`CodeLimits`). Two users: the
code reward (`rlvr.rewards.code`, programs against tests) and the python tool
(`rlvr.envs.python_tool`, one script per call: `run_python`). A missing or broken sandbox is
a `CodeSandboxError`, never a quiet fallback.
"""

from rlvr.sandbox.bwrap import SandboxedJudge, check_sandbox, sandbox_available
from rlvr.sandbox.limits import SANDBOXES, CodeLimits, CodeSandboxError, clean_text
from rlvr.sandbox.python import TOOL_STATUSES, ToolResult, run_python

__all__ = [
  "SANDBOXES",
  "TOOL_STATUSES",
  "CodeLimits",
  "CodeSandboxError",
  "SandboxedJudge",
  "ToolResult",
  "check_sandbox",
  "clean_text",
  "run_python",
  "sandbox_available",
]
