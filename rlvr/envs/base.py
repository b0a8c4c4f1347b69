"""What an environment is: the `Environment` protocol and an `Episode` in progress.

An episode starts from a prompt. The policy writes a turn; the turn ends at end of
sequence, at the token budget, or at one of the environment's `stop` strings; in the last
case the environment `observe`s the turn and answers with an observation (text it wants
the policy to read next, tokenized once by `rlvr.envs.episodes`) or ends the episode. The
final reward is the run's verifier's, on the whole transcript.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rlvr.envs.config import EnvConfig


@dataclasses.dataclass
class Episode:
  """One episode in progress: what the environment sees of it.

  prompt_text: the problem statement; turns: the policy's turns so far, as text (decoded
  from the tokens it wrote, which are kept as they are); observations: the environment's
  answers so far; tool_calls: calls made; info: counters an environment keeps (summed
  into the step's metrics as `env_<key>`); state: anything else it keeps per episode.
  """

  prompt_text: str
  turns: list[str] = dataclasses.field(default_factory=list)
  observations: list[str] = dataclasses.field(default_factory=list)
  tool_calls: int = 0
  info: dict[str, float] = dataclasses.field(default_factory=dict)
  state: dict[str, Any] = dataclasses.field(default_factory=dict)

  def count(self, key: str, value: float = 1.0) -> None:
    self.info[key] = self.info.get(key, 0.0) + value


class Environment(Protocol):
  """stop: strings that end a policy turn and hand over to `observe` (kept in the turn).
  observe(episode, turn) -> the observation text, or None to end the episode. It is called
  only for a turn that ended at a stop string; it may count a tool call
  (`episode.tool_calls`), and must not raise for anything the policy wrote. Its text is
  encoded as plain text: a special token's string in it stays text.

  Optional attributes: `blank`, what stands for an observation in the text the verifier
  reads (default "\\n": the final answer comes from the policy's own turns); `wrap`, a
  (before, after) pair of text put around every observation with its special-token
  strings encoded as special ids (a chat-style tool turn; default none)."""

  stop: tuple[str, ...]

  def observe(self, episode: Episode, turn: str) -> str | None: ...


class SingleTurn:
  """One prompt -> one response: no stop strings, nothing observed."""

  stop: tuple[str, ...] = ()

  def __init__(self, cfg: EnvConfig):
    del cfg

  def observe(self, episode: Episode, turn: str) -> str | None:
    return None
