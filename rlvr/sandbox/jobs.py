"""The job the judge inside the sandbox (`driver`) runs, as the JSON it reads on stdin: one
program, the inputs of its cases (never the expected outputs) and its limits.

kind: "stdio" (each case is the program's stdin; it reports what the program printed),
"call" (each case is the arguments of `fn_name`; it reports the returned value) or
"assert" (one case: `test`, code defining `check(candidate)`, run on `entry_point`).
"""

from __future__ import annotations

from rlvr.sandbox.limits import CodeLimits

JOB_KINDS = ("stdio", "call", "assert")


def job(
  kind: str,
  program: str,
  cases,
  limits: CodeLimits,
  *,
  fn_name: str | None = None,
  test: str | None = None,
  entry_point: str | None = None,
) -> dict:
  if kind not in JOB_KINDS:
    raise ValueError(f"job kind: unknown {kind!r}; expected one of {JOB_KINDS}")
  return {
    "kind": kind,
    "program": program,
    "cases": list(cases),
    "fn_name": fn_name,
    "test": test,
    "entry_point": entry_point,
    "limits": {
      "cpu_s": limits.cpu_s,
      "wall_s": limits.wall_s,
      "memory_bytes": limits.memory_bytes,
      "output_bytes": limits.output_bytes,
      "file_bytes": limits.file_bytes,
    },
  }


def script(program: str, limits: CodeLimits) -> dict:
  """`program` run once as a script with empty stdin (a tool call, the start-up probe)."""
  return job("stdio", program, [""], limits)
