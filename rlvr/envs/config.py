"""The `env` config section: which environment a policy acts in and its budgets."""

from __future__ import annotations

import dataclasses

from rlvr.sandbox.limits import CodeLimits

# What one tool call may use: tighter than a graded program's (calls are many and short).
TOOL_LIMITS = CodeLimits(
  memory_bytes=512 << 20, processes=8, output_bytes=64 << 10, file_bytes=4 << 20
)


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """name: "single_turn" (one prompt -> one response), "python_tool" (the policy runs
    python blocks mid-solution, `rlvr.envs.python_tool`) or "package.module:function"
    (a factory of a user's own `Environment`, called with this config).
  max_turns: policy turns per episode (a turn ends where the environment takes over).
  max_tool_calls: tool calls per episode; a turn that asks for one more ends the episode.
  max_total_tokens: prompt + every turn + every observation; 0 means the prompt plus
    rl.max_response_len, the budget of a single turn.
  observation_max_tokens: an observation longer than this is cut and marked.
  tool_limits: what one tool call may use in the sandbox.
  workers: observations (tool calls) made at once.
  sandbox: "bwrap" (model-written code runs only there) or "none" (trusted code only).
  """

  name: str = "single_turn"
  max_turns: int = 4
  max_tool_calls: int = 3
  max_total_tokens: int = 0
  observation_max_tokens: int = 128
  tool_limits: CodeLimits = TOOL_LIMITS
  workers: int = 8
  sandbox: str = "bwrap"

  def __post_init__(self):
    for field in ("max_turns", "max_tool_calls", "observation_max_tokens", "workers"):
      if getattr(self, field) < 1:
        raise ValueError(f"{field}: must be >= 1, got {getattr(self, field)}")
    if self.max_total_tokens < 0:
      raise ValueError(
        "max_total_tokens: must be >= 0 (0: prompt + rl.max_response_len), "
        f"got {self.max_total_tokens}"
      )
    if self.sandbox not in ("bwrap", "none"):
      raise ValueError(f"sandbox: expected 'bwrap' or 'none', got {self.sandbox!r}")
