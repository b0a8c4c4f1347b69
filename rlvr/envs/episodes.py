"""Episodes of several turns, token-exact: `Episodes.generate` takes the sampler itself
(anything with a `Sampler`'s `generate`) and returns each episode as one `Completion`.

A trajectory is the tokens the sampler returned for each turn, as returned, with the
observation tokens between them. Nothing the policy wrote is decoded and encoded again:
a turn is decoded only for the environment to read, and the next turn is sampled from the
prompt + trajectory token ids (vLLM: one request per episode and turn, its prefix cache
reusing the shared prefix; the in-process sampler: a batch of episodes of different
lengths). Observations are tokenized once, when made, as plain text: a special token's
string in a tool's output stays text (`rlvr.data.tokens`), so no observation can end a turn
or open one; the only special ids it may bring are those of the environment's declared
`wrap` (text around every observation, its markers parsed). An observation is made valid
Unicode first, and one that cannot be made or encoded ends its episode (`env_error_<kind>`),
never the run. The episode's `loss_mask` is 1 on the policy's tokens and 0 on the
observations, whose logprobs are 0; the learner's loss, entropy, KL, importance weights and
token counts all go through that mask.

The verifier reads the policy's own text (`Completion.answer_text`): its turns, each
observation replaced by the environment's `blank` (so a `\\boxed{}` printed by a tool earns
nothing).

A turn ends at end of sequence, at its token budget, or at one of the environment's `stop`
strings: after the first token that completes one (a sampler that does not stop there
itself, such as the in-process one, has its completion cut at that token; tokens sampled
after it are dropped, which leaves the distribution of those kept unchanged). The budgets
of `EnvConfig` end an episode ("length", as a truncated response): `max_turns`,
`max_tool_calls` (a turn that asks for one more), `max_total_tokens` (prompt + turns +
observations).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Callable, Sequence

from rlvr.data import tokens
from rlvr.envs.base import Environment, Episode
from rlvr.envs.config import EnvConfig
from rlvr.sampling.types import Completion, Sampler, SamplingParams

TRUNCATED = "\n[cut]\n```\n"  # ends an observation longer than its budget


def cut_at_stop(
  c: Completion, stops: Sequence[str], decode: Callable[[Sequence[int]], str]
) -> tuple[int, bool]:
  """(tokens kept, whether a stop string ended the turn): the shortest prefix of
  c.token_ids whose text holds one of `stops`, else all of it."""
  ids = c.token_ids
  if not stops or not any(s in decode(ids) for s in stops):
    return len(ids), False
  lo, hi = 1, len(ids)  # the text of a longer prefix holds whatever a shorter one holds
  while lo < hi:
    mid = (lo + hi) // 2
    if any(s in decode(ids[:mid]) for s in stops):
      hi = mid
    else:
      lo = mid + 1
  return lo, True


@dataclasses.dataclass
class _Trajectory:
  prompt: tuple[int, ...]
  episode: Episode
  budget: int  # prompt + everything after it
  ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  mask: list[int] = dataclasses.field(default_factory=list)
  texts: list[str] = dataclasses.field(default_factory=list)
  spans: list[list[str]] = dataclasses.field(default_factory=list)
  own: list[str] = dataclasses.field(default_factory=list)  # what the verifier reads
  finish: str = "stop"
  version: int | None = None
  routes: object = None

  @property
  def length(self) -> int:
    return len(self.prompt) + len(self.ids)

  def completion(self, logprobs: bool) -> Completion:
    ep = self.episode
    info = dict(ep.info, turns=len(ep.turns), tool_calls=ep.tool_calls)
    info["observation_tokens"] = len(self.mask) - sum(self.mask)
    info["spans"] = self.spans  # [["policy" | "env", text], ...]: the samples files show them
    info["answer_text"] = "".join(self.own)  # the policy's turns, observations blanked
    return Completion(
      token_ids=tuple(self.ids),
      logprobs=tuple(self.logprobs) if logprobs else None,
      text="".join(self.texts),
      finish_reason=self.finish,
      weight_version=self.version,
      routes=self.routes,
      loss_mask=tuple(self.mask),
      info=info,
    )


def _room_bucket(room: int, cap: int) -> int:
  """max_tokens of a turn with `room` tokens left: cap, or the power of two <= room
  (episodes with about the same room share one generate call)."""
  return cap if room >= cap else 1 << (room.bit_length() - 1)


class Episodes:
  """Runs `environment` episodes on a sampler."""

  def __init__(
    self,
    environment: Environment,
    cfg: EnvConfig,
    *,
    decode: Callable[[Sequence[int]], str],
    encode: Callable[[str], list[int]],
    encode_markers: Callable[[str], list[int]] | None = None,
    agree: Callable[[list], list] | None = None,
  ):
    """decode / encode: the run's tokenizer (a turn's text; an observation's ids, once, as
    plain text: `tokens.encode_plain`). encode_markers: text whose special-token strings
    are special ids, for the environment's `wrap` (needed only when it declares one).
    agree: on several processes, process 0's copy of a JSON-able list (`_observe`)."""
    self.environment, self.cfg = environment, cfg
    self.decode, self.encode, self.agree = decode, encode, agree
    self.truncated_ids = encode(TRUNCATED)
    self.blank = getattr(environment, "blank", "\n")
    before, after = getattr(environment, "wrap", ("", ""))
    if (before or after) and encode_markers is None:
      raise ValueError(
        f"environment {type(environment).__name__} declares a wrap; Episodes needs "
        "encode_markers to encode it"
      )
    self.wrap_ids = (
      (encode_markers(before) if before else [], encode_markers(after) if after else [])
      if encode_markers is not None
      else ([], [])
    )
    if len(self.truncated_ids) >= cfg.observation_max_tokens:
      raise ValueError(
        f"env.observation_max_tokens: {cfg.observation_max_tokens} leaves no room beside "
        f"the {len(self.truncated_ids)} tokens that mark a cut observation"
      )

  @property
  def multi_turn(self) -> bool:
    return bool(self.environment.stop)

  def generate(
    self,
    sampler: Sampler,
    prompt_ids: list[Sequence[int]],
    sp: SamplingParams,
    texts: Sequence[str] | None = None,
  ) -> list[list[Completion]]:
    """sp.n episodes per prompt; outs[i][j] is the j-th episode of prompt i. texts: the
    problem statements (what `Episode.prompt_text` shows the environment)."""
    if not self.multi_turn:
      return sampler.generate(prompt_ids, sp)
    sp = dataclasses.replace(sp, stop=tuple(dict.fromkeys(sp.stop + self.environment.stop)))
    texts = texts or [""] * len(prompt_ids)
    trajs = [
      [
        _Trajectory(
          tuple(p),
          Episode(texts[i]),
          self.cfg.max_total_tokens or len(p) + sp.max_tokens,
        )
        for _ in range(sp.n)
      ]
      for i, p in enumerate(prompt_ids)
    ]
    first = sampler.generate(prompt_ids, sp)
    pending = [(trajs[i][j], c) for i, outs in enumerate(first) for j, c in enumerate(outs)]
    round_ = 0
    while pending:
      waiting = [t for t, c in pending if self._take_turn(t, c)]
      observed = self._observe(waiting)
      asks = [(t, room) for t, obs in zip(waiting, observed) if (room := self._add(t, obs, sp))]
      round_ += 1
      pending = self._next_turns(sampler, asks, sp, round_)
    return [[t.completion(sp.logprobs) for t in row] for row in trajs]

  def _take_turn(self, t: _Trajectory, c: Completion) -> bool:
    """Adds a sampled turn to `t`; whether the environment is to answer it."""
    keep, stopped = cut_at_stop(c, self.environment.stop, self.decode)
    turn = c.token_ids[:keep]
    t.ids += turn
    t.logprobs += (c.logprobs or (0.0,) * len(c.token_ids))[:keep]
    t.mask += [1] * keep
    if t.version is None or (c.weight_version is not None and c.weight_version < t.version):
      t.version = c.weight_version
    if c.routes is not None:
      t.routes = c.routes[: t.length]
    text = self.decode(turn)
    t.texts.append(text)
    t.spans.append(["policy", text])
    t.own.append(text)
    t.episode.turns.append(text)
    if not stopped:
      t.finish = c.finish_reason
      return False
    if len(t.episode.turns) >= self.cfg.max_turns:
      return self._end(t, "budget_turns")
    if t.episode.tool_calls >= self.cfg.max_tool_calls:
      return self._end(t, "budget_tool_calls")
    return True

  def _observe(self, waiting: list[_Trajectory]) -> list[str | None]:
    """The environment's answers to the last turns of `waiting`, `cfg.workers` at a time;
    one that raises ends its episode (counted as `env_error_<exception>`). On several
    processes every one computes them and all take process 0's (`agree`), so a tool whose
    output differs between hosts cannot make their batches differ."""

    def one(t: _Trajectory) -> str | None:
      try:
        obs = self.environment.observe(t.episode, t.episode.turns[-1])
        if obs is not None and not isinstance(obs, str):
          raise TypeError(f"observe returned {type(obs).__name__}, not str")
        return None if obs is None else tokens.sanitize(obs)
      except Exception as e:  # noqa: BLE001 - the environment failed on this turn: it ends
        t.episode.count(f"env_error_{type(e).__name__}")
        return None

    if not waiting:
      return []
    with concurrent.futures.ThreadPoolExecutor(min(self.cfg.workers, len(waiting))) as pool:
      observed = list(pool.map(one, waiting))
    if self.agree is not None:
      mine = [[o, t.episode.tool_calls, t.episode.info] for t, o in zip(waiting, observed)]
      observed = []
      for t, (o, calls, info) in zip(waiting, self.agree(mine)):
        t.episode.tool_calls, t.episode.info = int(calls), dict(info)
        observed.append(o)
    return observed

  def _add(self, t: _Trajectory, obs: str | None, sp: SamplingParams) -> int:
    """Appends an observation to `t`; the tokens its next turn may take, or 0 when the
    episode is over."""
    if obs is None:
      t.finish = "stop" if not any(k.startswith("env_error_") for k in t.episode.info) else "length"
      return 0
    try:
      ids = [int(i) for i in self.encode(obs)]
    except Exception as e:  # noqa: BLE001 - an observation the tokenizer refuses ends its episode
      t.episode.count(f"env_error_encode_{type(e).__name__}")
      return self._add(t, None, sp)
    if len(ids) > self.cfg.observation_max_tokens:
      t.episode.count("observation_cut")
      ids = ids[: self.cfg.observation_max_tokens - len(self.truncated_ids)] + self.truncated_ids
    before, after = self.wrap_ids
    ids = before + ids + after
    room = t.budget - t.length - len(ids)
    if room < 1:
      return self._end(t, "budget_tokens")
    t.ids += ids
    t.logprobs += [0.0] * len(ids)
    t.mask += [0] * len(ids)
    shown = self.decode(ids)
    t.texts.append(shown)
    t.spans.append(["env", shown])
    t.own.append(self.blank)
    t.episode.observations.append(shown)
    return min(room, sp.max_tokens)

  @staticmethod
  def _end(t: _Trajectory, reason: str) -> int:
    t.episode.count(reason)
    t.finish = "length"
    return 0

  def _next_turns(self, sampler: Sampler, asks, sp: SamplingParams, round_: int):
    """One generate call per token budget (few: budgets are bucketed), n=1 per episode."""
    by_budget: dict[int, list[_Trajectory]] = {}
    for t, room in asks:
      by_budget.setdefault(_room_bucket(room, sp.max_tokens), []).append(t)
    pending = []
    for k, (budget, group) in enumerate(sorted(by_budget.items())):
      seed = None if sp.seed is None else (sp.seed * 7919 + round_ * 104_729 + k * 15_485_863)
      turn_sp = dataclasses.replace(
        sp, n=1, max_tokens=budget, seed=None if seed is None else seed % (2**31)
      )
      outs = sampler.generate([list(t.prompt) + t.ids for t in group], turn_sp)
      pending += [(t, out[0]) for t, out in zip(group, outs)]
    return pending


def episodes_for(
  cfg: EnvConfig, environment: Environment, tokenizer, agree: Callable[[list], list] | None = None
) -> Episodes:
  """`Episodes` over an HF tokenizer: a turn decoded as the samplers decode a response (special
  tokens skipped), an observation tokenized once as plain text (`tokens.encode_plain`: its
  special-token strings stay text), the environment's `wrap` with its markers."""
  return Episodes(
    environment,
    cfg,
    decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
    encode=lambda text: tokens.encode_plain(tokenizer, text),
    encode_markers=lambda text: tokens.encode_markers(tokenizer, text),
    agree=agree,
  )
