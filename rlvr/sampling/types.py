"""The narrow sampler interface: parameters in, completions out, weights pushed."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters.

  repetition_penalty: as vLLM and HF define it (1 = off): every token id seen in
  the prompt or the completion so far has its raw logit divided by it when
  positive and multiplied by it otherwise, before temperature / top-k / top-p
  (and before the greedy argmax). Returned logprobs stay the raw model's.

  seed: base seed of the call; prompt i draws from seed + i, so a prompt's
  samples do not depend on which other prompts share the call.
  """

  n: int = 1
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  repetition_penalty: float = 1.0
  max_tokens: int = 256
  stop_token_ids: tuple[int, ...] = ()
  # Strings that end a completion, kept at its end (an environment's turn end, such as
  # "```output"). A server honours them; where a sampler does not, `rlvr.envs` cuts the
  # completion after the first token that completes one (the same tokens either way).
  stop: tuple[str, ...] = ()
  seed: int | None = 0
  logprobs: bool = True
  ignore_eos: bool = False

  def __post_init__(self):
    if self.n < 1:
      raise ValueError(f"n: must be >= 1, got {self.n}")
    if self.temperature < 0:
      raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k: must be >= 0 (0 = off), got {self.top_k}")
    if not self.repetition_penalty > 0:
      raise ValueError(f"repetition_penalty: must be > 0 (1 = off), got {self.repetition_penalty}")
    if self.max_tokens < 1:
      raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")


@dataclasses.dataclass(frozen=True)
class Completion:
  """One sampled continuation.

  token_ids include the stop token when one ended the sequence; logprobs[i]
  is log pi(token_ids[i] | prefix) under the raw model distribution (logits
  before repetition penalty / temperature / top-k / top-p), as the learner
  computes it and vLLM returns it by default (logprobs_mode "raw_logprobs"). finish_reason: "stop" (EOS or a stop id) or "length".
  """

  token_ids: tuple[int, ...]
  logprobs: tuple[float, ...] | None
  text: str
  finish_reason: str
  weight_version: int | None = None
  # mixture of experts: int32 [prompt + completion tokens, sparse layers, k], the experts
  # each input token was routed to (-1 where none: a completion's last token is never fed)
  routes: Any = dataclasses.field(default=None, compare=False)
  # A multi-turn episode (`rlvr.envs`): 1 on the tokens the policy wrote, 0 on the
  # observations the environment put between its turns (no loss there, logprob 0).
  # None: every token is the policy's.
  loss_mask: tuple[int, ...] | None = None
  # What the episode did (`rlvr.envs.Episode.info`): turns, tool calls, their errors...
  info: Any = dataclasses.field(default=None, compare=False)

  @property
  def answer_text(self) -> str:
    """The text a verifier reads: `text`, or for an episode the policy's turns alone (each
    observation replaced by its environment's blank: `rlvr.envs.episodes`)."""
    own = self.info.get("answer_text") if isinstance(self.info, dict) else None
    return own if isinstance(own, str) else self.text

  @property
  def policy_tokens(self) -> int:
    """How many of token_ids the policy wrote (observations excluded)."""
    return len(self.token_ids) if self.loss_mask is None else int(sum(self.loss_mask))


class Sampler(Protocol):
  """What the training loop needs from a sampler backend."""

  eos_token_id: int
  pad_token_id: int
  overlaps_update: bool  # generate may run in a thread while the learner updates

  def generate(
    self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams
  ) -> list[list[Completion]]:
    """outs[i][j]: the j-th of params.n completions of prompt i."""
    ...

  def update_weights(self, params: Any, version: int) -> None:
    """Serves `params` from now on; later generate calls see only this version."""
    ...
