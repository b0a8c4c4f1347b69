"""The python tool: the policy writes a python block, ends it with "```output", and reads
what the block printed before it goes on (tool-integrated reasoning, as ToRL and the
Qwen2.5-Math TIR format write it):

    ...so the product is
    ```python
    print(4821 * 377)
    ```
    ```output
    1817517
    ```
    The answer is \\boxed{1817517}.

The policy writes everything up to and including "```output"; the environment writes the
output lines and the closing fence. Each block runs alone in a fresh sandboxed process
(ToRL's choice; nothing persists between the calls of an episode: a block that needs an
earlier value computes it again). A block that fails shows what it printed and a last line
naming how it failed ("runtime_error: ZeroDivisionError: division by zero", "timeout: wall
limit (4.0 s)"); a turn that asks for output without a python block is told so.
"""

from __future__ import annotations

import re

from rlvr import sandbox as sandbox_lib
from rlvr.envs.base import Episode
from rlvr.envs.config import EnvConfig
from rlvr.sandbox import run_python

OUTPUT_OPEN = "```output"
OUTPUT_CLOSE = "\n```\n"
_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)


def last_block(turn: str) -> str | None:
  """The last complete python block of a turn (before its closing "```output")."""
  head = turn[: turn.rfind(OUTPUT_OPEN)] if OUTPUT_OPEN in turn else turn
  blocks = _BLOCK.findall(head)
  return blocks[-1] if blocks else None


class PythonTool:
  """`env.name = "python_tool"`: runs each python block in the bubblewrap sandbox under
  `env.tool_limits`; counts `tool_calls`, `tool_time_s` and `tool_error_<status>`."""

  stop = (OUTPUT_OPEN,)
  blank = OUTPUT_CLOSE  # what the verifier reads for an output: the fence closed, empty

  def __init__(self, cfg: EnvConfig):
    sandbox_lib.check_sandbox(cfg.sandbox)  # a missing sandbox stops the run here, once
    self.cfg = cfg

  def observe(self, episode: Episode, turn: str) -> str | None:
    code = last_block(turn)
    if code is None:
      episode.count("tool_no_code")
      return "\nno python block to run\n```\n"
    episode.tool_calls += 1
    result = run_python(code, self.cfg.tool_limits, self.cfg.sandbox)
    episode.count("tool_time_s", result.seconds)
    out = result.stdout.rstrip("\n")
    if result.status != "ok":
      episode.count(f"tool_error_{result.status}")
      out += ("\n" if out else "") + f"{result.status}: {result.detail}".rstrip(": ")
    return "\n" + out + OUTPUT_CLOSE
