"""What rollouts are made of: a `Prompt` (token ids and the answer it is scored against)
and a `Group` (one prompt's responses, scored)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rlvr.sampling.types import Completion


@dataclasses.dataclass(frozen=True)
class Prompt:
  """A problem as the policy sees it: prompt token ids plus the answer it is scored against.

  Methods draw these from the training set and create new ones (synthetic,
  composed, variants); `source` says where one came from, `text` is the
  problem statement (without chat template) for methods that rewrite it.
  """

  ids: tuple[int, ...]
  answer: str
  text: str = ""
  source: str = ""


@dataclasses.dataclass
class Group:
  """One prompt's G responses, scored."""

  prompt: Prompt
  completions: list[Completion]
  rewards: np.ndarray  # [G] float
  correct: np.ndarray  # [G] bool
  tags: dict[str, str] = dataclasses.field(default_factory=dict)  # a method's labels of the
  # group (SvS: data_type), written with its responses to the samples log (`samples_log`)

  @property
  def mixed(self) -> bool:
    """Some but not all responses correct (DAPO's dynamic-sampling filter: by accuracy, so
    shaping terms such as the overlong penalty do not make a solved group 'mixed')."""
    return bool(self.correct.any() and not self.correct.all())
