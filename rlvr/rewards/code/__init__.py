"""Code as a verifiable domain: programs run against tests in a bubblewrap sandbox.

Model-written code is hostile by assumption: it runs only inside the sandbox (`rlvr.sandbox`),
and a missing or broken sandbox is a `CodeSandboxError`, never a quiet fallback.
`run_tests(program, tests, limits)` judges one program (`Verdict`: passed, total, reason);
`score(responses, tests_list, cfg)` extracts each response's program (`extract`) and judges
many at once. Test formats and comparisons are `formats`'s; the judge that runs inside the
sandbox, one process per test case, is `rlvr.sandbox.driver`.
"""

from rlvr.rewards.code.config import CODE_EXTRACTIONS, REASONS, CodeRewardConfig, CodeScore, Verdict
from rlvr.rewards.code.extract import extract_program, last_python_block
from rlvr.rewards.code.formats import TestSpec, lines_match, parse_tests, values_match
from rlvr.rewards.code.judge import run_tests, score
from rlvr.sandbox import SANDBOXES, CodeLimits, CodeSandboxError, check_sandbox, sandbox_available

__all__ = [
  "CODE_EXTRACTIONS",
  "REASONS",
  "SANDBOXES",
  "CodeLimits",
  "CodeRewardConfig",
  "CodeSandboxError",
  "CodeScore",
  "TestSpec",
  "Verdict",
  "check_sandbox",
  "extract_program",
  "last_python_block",
  "lines_match",
  "parse_tests",
  "run_tests",
  "sandbox_available",
  "score",
  "values_match",
]
