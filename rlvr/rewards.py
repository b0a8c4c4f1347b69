"""Verifiable rewards: answer extraction, math-verify equivalence, a hang-proof pool.

A response earns `correct` (1/0: its final answer matches the reference) plus
`format_bonus` when it states a well-formed final answer (QbQ: 0.1 for a boxed
integer). Extraction and string normalisation are pure functions that run in
the caller; math-verify (sympy) runs in worker processes because a single
pathological answer (`9^{9^{9^{9}}}`, `(10^8)!`) can hold a CPU for minutes and
its own timeouts use `signal.alarm`, which works only in a process's main
thread. `RewardPool` kills and replaces a worker whose item overruns its time
(or that dies), scores that item 0, and carries on with the rest of the batch.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.connection
import re
import signal
import threading
import time
from typing import Callable, Sequence

import numpy as np

EXTRACTIONS = ("boxed", "answer_line")

# ----------------------------------------------------------------------------
# Answer extraction
# ----------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_THINK_END = "</think>"


def _braced_group(text: str, start: int) -> tuple[str, int] | None:
  """Content of the `{...}` group opening at text[start], by brace counting.

  `\\{` and `\\}` are literal braces in LaTeX, so a backslash skips the next
  character. Returns (content, index after the closing brace) or None when
  the group never closes (a truncated response).
  """
  depth = 0
  i = start
  while i < len(text):
    ch = text[i]
    if ch == "\\":
      i += 2
      continue
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1:i], i + 1
    i += 1
  return None


def extract_boxed(text: str) -> str | None:
  r"""Content of the LAST `\boxed{...}` / `\fbox{...}` (or `\boxed 5`), else None.

  Only the last box counts: a model that boxes several candidates is judged
  by its final one. An unbalanced last box (cut off by the length limit) is
  None, not an earlier box, so a truncated response never scores.
  """
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  rest = matches[-1].end()
  stripped = text[rest:].lstrip()
  if stripped.startswith("{"):
    group = _braced_group(text, len(text) - len(stripped))
    return None if group is None else group[0].strip()
  if rest < len(text) and text[rest] in " \t":   # `\boxed 5`: one token
    token = re.match(r"[^\s$]+", stripped)
    return token.group(0).rstrip(".,;") if token else None
  return None


_ANSWER_LINE_RE = re.compile(r"^[ \t>#*_]*answer[ \t*_]*:[ \t*_]*(.*?)[ \t*_]*$",
                             re.IGNORECASE | re.MULTILINE)


def extract_answer_line(text: str) -> str | None:
  """Value of the last `Answer: ...` line (DAPO's output format), else None.

  Markdown emphasis around the label is tolerated (`**Answer:** 5`); `$`
  delimiters and a trailing period are removed; a boxed value is unboxed.
  """
  matches = _ANSWER_LINE_RE.findall(text)
  if not matches:
    return None
  value = matches[-1].strip()
  boxed = extract_boxed(value)
  if boxed is not None:
    return boxed
  value = value.rstrip(".").strip()
  if value.startswith("$") and value.endswith("$"):
    value = value.strip("$").strip()
  elif value.startswith("\\(") and value.endswith("\\)"):
    value = value[2:-2].strip()
  return value.rstrip(".").strip()


def after_thinking(text: str) -> str:
  """Text after the last `</think>`: reasoning models may box drafts while thinking."""
  cut = text.rfind(_THINK_END)
  return text if cut < 0 else text[cut + len(_THINK_END):]


def extract_answer(text: str, mode: str = "boxed") -> str | None:
  """Final answer of a response by `mode` ("boxed" | "answer_line"); None if absent or empty."""
  if mode == "boxed":
    answer = extract_boxed(after_thinking(text))
  elif mode == "answer_line":
    answer = extract_answer_line(after_thinking(text))
  else:
    raise ValueError(f"mode: unknown {mode!r}; expected one of {EXTRACTIONS}")
  return answer or None


# ----------------------------------------------------------------------------
# Normalisation
# ----------------------------------------------------------------------------

_TEXT_CMD = r"\\(?:text|textbf|textit|textrm|mathrm|mbox|mathbf|operatorname)"
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_INTEGER_RE = re.compile(r"^[+-]?\d+$")


def _unwrap_text(s: str) -> str:
  r"""`\text{abc}` -> `abc` (all text-like commands, nested groups kept balanced)."""
  out, pos = [], 0
  for m in re.finditer(_TEXT_CMD + r"\s*(?=\{)", s):
    if m.start() < pos:
      continue
    group = _braced_group(s, m.end())
    if group is None:
      break
    out.append(s[pos:m.start()])
    out.append(group[0])
    pos = group[1]
  out.append(s[pos:])
  return "".join(out)


def _strip_thousands(s: str) -> str:
  """`1,000` / `1{,}000` -> `1000` when the whole string is one such number (`1, 000` is a list)."""
  t = s.strip().replace("{,}", ",")
  return t.replace(",", "") if _THOUSANDS_RE.match(t) else s


def normalize_integer(s: str) -> str | None:
  r"""Canonical integer string of an AIME-style answer, or None if it is no integer.

  Strips `$`, spaces, thousands separators, `\text{}`, `^\circ`, a leading
  `+` and a trailing `.0`: `$1{,}000$` -> "1000", `070` -> "70", `1,2` -> None.
  """
  if s is None:
    return None
  t = _unwrap_text(str(s)).replace("\\$", "").replace("$", "").replace("\\,", ",")
  t = _DEGREE_RE.sub("", t.replace("\\!", "").replace("\\ ", ""))
  t = re.sub(r"\s+", "", t)
  t = _strip_thousands(t)
  t = re.sub(r"\.0+$", "", t).lstrip("+")
  if not _INTEGER_RE.match(t):
    return None
  return str(int(t))


_UNIT_WORDS = (r"(?:square|sq\.?|cubic)?\s*(?:units?|inch(?:es)?|in\.?|feet|foot|ft|yards?|"
               r"miles?|meters?|metres?|cm|mm|km|m|centimeters?|kilometers?|seconds?|minutes?|"
               r"hours?|days?|weeks?|years?|dollars?|cents?|degrees?|radians?|mph|pounds?|"
               r"ounces?|cups?|gallons?|liters?|grams?|kg|people|students|ways|cookies|"
               r"handshakes|games|points?|teams?)")
_TEXT_UNIT_RE = re.compile(_TEXT_CMD + r"\s*\{\s*" + _UNIT_WORDS + r"\s*\}(\s*\^\s*\{?\d\}?)?",
                           re.IGNORECASE)
_MATRIX_ROW_RE = re.compile(r"(?<!\\)\\(?=\s*[-+\d.])")
_MATRIX_ENV_RE = re.compile(r"(\\begin\{[pbvBV]?matrix\})(.*?)(\\end\{[pbvBV]?matrix\})", re.DOTALL)


def _fix_matrix_rows(s: str) -> str:
  r"""`\begin{pmatrix}1\2\end{pmatrix}` -> rows split by `\\` (a lost backslash in MATH golds)."""
  return _MATRIX_ENV_RE.sub(
      lambda m: m.group(1) + _MATRIX_ROW_RE.sub(r"\\\\", m.group(2)) + m.group(3), s)


def clean_latex(s: str, unit_power: bool = True) -> str:
  r"""Removes notation that does not change the value of a final answer.

  `\dfrac`/`\tfrac`, `\left`/`\right`, `\!`/`\,` spacing, `\displaystyle`,
  `^\circ`, `\%`, `\$`, unit words in `\text{}` (with their power when
  `unit_power`; `15\text{ cm}^2` is `15` vs `15^2` depending on whose gold
  you read), thousands separators, a trailing period and `$` delimiters.
  """
  t = s.strip()
  if t.startswith("$") and t.endswith("$"):
    t = t.strip("$")
  t = t.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  t = re.sub(r"\\left\s*\.|\\right\s*\.", "", t)
  t = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![A-Za-z])", "", t)
  t = re.sub(r"\\displaystyle|\\!|\\[,;:]|\\ |~", " ", t)
  t = _DEGREE_RE.sub("", t)
  t = t.replace("\\%", "").replace("%", "").replace("\\$", "")
  t = _TEXT_UNIT_RE.sub("" if unit_power else r"\1", t)
  t = _fix_matrix_rows(t)
  t = t.strip().rstrip(".").strip()
  return _strip_thousands(t).strip()


def _squash(s: str) -> str:
  return re.sub(r"\s+", "", s)


def _as_words(s: str) -> str | None:
  r"""Lower-case words of a text answer (`\text{(C) Evelyn}` -> `(c)evelyn`), None for maths."""
  t = re.sub(r"\\[,;:! ]|~", " ", _unwrap_text(s).replace("$", "")).strip().rstrip(".")
  choice = re.match(r"^\(?([A-Za-z])\)?$", t)        # multiple choice: (C) / C
  if choice:
    return choice.group(1).lower()
  if "\\" in t or not re.search(r"[A-Za-z]{2,}", t):
    return None
  return _squash(t).lower()


# ----------------------------------------------------------------------------
# Equivalence
# ----------------------------------------------------------------------------

def _quick_verdict(pred: str | None, gold: str, integer_answers: bool) -> bool | None:
  """Decision without sympy where strings settle it; None means "ask math-verify"."""
  if not pred:
    return False
  if _squash(pred) == _squash(gold):
    return True
  gold_int = normalize_integer(gold)
  if gold_int is not None:
    pred_int = normalize_integer(pred)
    if integer_answers or pred_int is not None:   # two integers: equal or not, no sympy needed
      return pred_int == gold_int
  return None


_PARSED: collections.OrderedDict = collections.OrderedDict()   # per process: latex -> parse
_PARSED_MAX = 4096


def _mv_parse(latex: str, timeout: int):
  """math-verify parse of a bare answer; golds parse reliably only when wrapped.

  Parsing (antlr) is most of math-verify's time and a gold is judged against
  every response of its group, so successful parses are kept (LRU).
  """
  if latex in _PARSED:
    _PARSED.move_to_end(latex)
    return _PARSED[latex]
  from math_verify import parse
  for wrapped in (f"\\boxed{{{latex}}}", f"${latex}$"):
    parsed = parse(wrapped, parsing_timeout=timeout)
    if parsed:
      _PARSED[latex] = parsed
      if len(_PARSED) > _PARSED_MAX:
        _PARSED.popitem(last=False)
      return parsed
  return []


def is_equivalent(pred: str, gold: str, integer_answers: bool = False,
                  timeout_s: float = 5.0) -> bool:
  r"""Whether answer `pred` means the same as reference `gold` (both bare LaTeX).

  Strings first (identical, integer-normalised, cleaned, or the same words
  case-insensitively), then math-verify `verify(parse(gold), parse(pred))` on
  the cleaned forms. math-verify's own `signal.alarm` timeouts bound each step,
  so call this in a process's main thread (a `RewardPool` worker); the whole
  call gives up once `timeout_s` has passed.
  """
  quick = _quick_verdict(pred, gold, integer_answers)
  if quick is not None:
    return quick
  gold_clean = clean_latex(gold)
  preds = list(dict.fromkeys([clean_latex(pred), clean_latex(pred, unit_power=False)]))
  if any(_squash(p) == _squash(gold_clean) for p in preds):
    return True
  gold_words = _as_words(gold)
  if gold_words is not None and any(_as_words(p) == gold_words for p in [pred, *preds]):
    return True
  from math_verify import verify
  deadline = time.monotonic() + timeout_s

  def budget() -> int | None:
    """Whole seconds left for the next math-verify step (signal.alarm takes ints)."""
    left = deadline - time.monotonic()
    return None if left <= 0 else max(1, math.ceil(left))

  gold_parsed = _mv_parse(gold_clean, budget())
  for p in preds:
    if not gold_parsed or (t := budget()) is None:
      return False
    pred_parsed = _mv_parse(p, t)
    if (t := budget()) is None:
      return False
    if pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=t):
      return True
  return False


# ----------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How responses are turned into rewards.

  extraction: "boxed" (last `\\boxed{}`) or "answer_line" (last `Answer: ...`).
  integer_answers: answers are integers (AIME, DAPO-17k): compare as integers,
    and only an integer final answer counts as well-formed.
  format_bonus: added to the reward when a well-formed answer is present (QbQ 0.1).
  timeout_s: time one answer may spend in math-verify before it scores 0.
  """
  extraction: str = "boxed"
  integer_answers: bool = False
  format_bonus: float = 0.0
  timeout_s: float = 5.0

  def __post_init__(self):
    if self.extraction not in EXTRACTIONS:
      raise ValueError(f"RewardConfig.extraction: unknown {self.extraction!r}; "
                       f"expected one of {EXTRACTIONS}")
    if not isinstance(self.integer_answers, bool):
      raise TypeError(f"RewardConfig.integer_answers: expected bool, got {self.integer_answers!r}")
    if (isinstance(self.format_bonus, bool) or not isinstance(self.format_bonus, (int, float))
        or not math.isfinite(self.format_bonus)):
      raise ValueError(f"RewardConfig.format_bonus: expected a finite number, "
                       f"got {self.format_bonus!r}")
    if (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float))
        or not self.timeout_s > 0 or not math.isfinite(self.timeout_s)):
      raise ValueError(f"RewardConfig.timeout_s: expected a positive finite number of seconds, "
                       f"got {self.timeout_s!r}")


@dataclasses.dataclass(frozen=True)
class ScoreResult:
  """Per-response scores of one `score` call.

  rewards = correct + format_bonus * well_formed, except that an item that
  timed out or crashed its worker scores 0 (correct and well_formed False).
  timeouts / errors count those items.
  """
  rewards: np.ndarray
  correct: np.ndarray
  well_formed: np.ndarray
  extracted: list
  timeouts: int
  errors: int


def is_well_formed(extracted: str | None, integer_answers: bool) -> bool:
  """A final answer is present (and, for integer tasks, is an integer)."""
  if not extracted:
    return False
  return normalize_integer(extracted) is not None if integer_answers else True


def _check_inputs(responses: Sequence[str], answers: Sequence) -> list[str]:
  """Reference answers as strings; clear errors for mismatched lengths and bad rows."""
  if isinstance(responses, str) or isinstance(answers, str):
    raise TypeError("responses, answers: expected sequences of strings, got a single str")
  if len(responses) != len(answers):
    raise ValueError(f"responses / answers: lengths differ ({len(responses)} vs {len(answers)})")
  for i, r in enumerate(responses):
    if not isinstance(r, str):
      raise TypeError(f"responses[{i}]: expected str, got {type(r).__name__}")
  golds = []
  for i, a in enumerate(answers):
    if isinstance(a, bool) or not isinstance(a, (str, int)):
      raise TypeError(f"answers[{i}]: expected str or int, got {type(a).__name__}")
    a = str(a).strip()
    if not a:
      raise ValueError(f"answers[{i}]: empty reference answer")
    golds.append(a)
  return golds


# Worker -> parent status codes.
_WRONG, _RIGHT, _TIMEOUT, _ERROR = 0, 1, 2, 3
# A worker gets this long to import math-verify (spawn start, loaded machine) before its first item.
_STARTUP_LIMIT_S = 120.0


def _worker_main(conn, judge: Callable) -> None:
  """Worker loop: receive (integer_answers, timeout_s, [(key, pred, gold)]), answer per item.

  One message per item lets the parent see which item is running, so a hang
  is pinned on the right item and the rest of the chunk is re-queued.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
  # Timeouts come back as counts in ScoreResult; math-verify's per-item warnings would flood logs.
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  import math_verify  # noqa: F401 - imported before "ready", so no item pays for it
  conn.send(None)                                  # started: later deaths are the items' doing
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg is None:
      return
    integer_answers, timeout_s, items = msg
    for key, pred, gold in items:
      start = time.monotonic()
      try:
        status = _RIGHT if judge(pred, gold, integer_answers, timeout_s) else _WRONG
      except Exception:  # noqa: BLE001 - any failure of one answer scores it 0
        status = _ERROR
      if status == _WRONG and time.monotonic() - start >= timeout_s:
        status = _TIMEOUT                            # math-verify's own alarm cut it short
      conn.send((key, status))


@dataclasses.dataclass
class _Worker:
  process: multiprocessing.process.BaseProcess
  conn: multiprocessing.connection.Connection
  chunk: list = dataclasses.field(default_factory=list)
  done: int = 0
  since: float = 0.0                                 # when the current item started
  ready: bool = False                                # its start-up message has arrived


class RewardPool:
  """Worker processes that run math-verify, surviving hangs and crashes.

  Items are sent in chunks; each worker reports every item as it finishes.
  An item running longer than `timeout_s + grace_s` gets its worker killed
  (SIGKILL) and replaced: the item scores 0 and counts as a timeout, the
  rest of its chunk goes back to the queue. A worker that dies (segfault,
  OOM kill) likewise costs only its current item (counted in `errors`).

  Workers come from a "forkserver" that has math-verify imported, so a
  replacement starts in milliseconds and nothing is forked from a parent
  that holds JAX threads. `timeout_s=None` uses each call's `config.timeout_s`.
  `judge(pred, gold, integer_answers, timeout_s) -> bool` must be a
  module-level function (it is pickled by name); default `is_equivalent`.
  One `score` call at a time (calls are serialised by a lock).
  """

  def __init__(self, workers: int = 2, timeout_s: float | None = None, grace_s: float = 2.0,
               judge: Callable = is_equivalent, start_method: str = "forkserver"):
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
      raise ValueError(f"RewardPool.workers: expected an int >= 1, got {workers!r}")
    if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
      raise ValueError(f"RewardPool.timeout_s: expected None or positive seconds, "
                       f"got {timeout_s!r}")
    if not grace_s >= 0:
      raise ValueError(f"RewardPool.grace_s: expected seconds >= 0, got {grace_s!r}")
    self.timeout_s = timeout_s
    self.grace_s = grace_s
    self._judge = judge
    self._ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
      # Only takes effect if this interpreter's fork server is not running yet.
      self._ctx.set_forkserver_preload(["rlvr.rewards", "math_verify"])
    self._lock = threading.Lock()
    self._closed = False
    self.restarts = 0                                # workers replaced after a hang or a death
    self._workers = [self._start_worker() for _ in range(workers)]

  def _start_worker(self) -> _Worker:
    parent_conn, child_conn = self._ctx.Pipe(duplex=True)
    process = self._ctx.Process(target=_worker_main, args=(child_conn, self._judge),
                                daemon=True, name="rlvr-reward-worker")
    process.start()
    child_conn.close()
    return _Worker(process, parent_conn)

  def _replace(self, i: int) -> None:
    """Kill worker i (if still alive) and start a fresh one in its slot."""
    w = self._workers[i]
    if w.process.is_alive():
      w.process.kill()
    w.process.join(timeout=5)
    w.conn.close()
    self._workers[i] = self._start_worker()
    self.restarts += 1

  def __enter__(self) -> RewardPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the workers (politely, then by force)."""
    if self._closed:
      return
    self._closed = True
    for w in self._workers:
      try:
        w.conn.send(None)
      except (OSError, ValueError):
        pass
    deadline = time.monotonic() + 2.0
    for w in self._workers:
      w.process.join(timeout=max(0.0, deadline - time.monotonic()))
      if w.process.is_alive():
        w.process.kill()
        w.process.join(timeout=5)
      w.conn.close()

  def score(self, responses: Sequence[str], answers: Sequence[str],
            config: RewardConfig = RewardConfig()) -> ScoreResult:
    """Rewards of `responses` against reference `answers` (same length)."""
    golds = _check_inputs(responses, answers)
    extracted = [extract_answer(r, config.extraction) for r in responses]
    well_formed = np.array([is_well_formed(e, config.integer_answers) for e in extracted], bool)
    correct = np.zeros(len(responses), bool)
    failed = np.zeros(len(responses), bool)
    # Identical (answer, gold) pairs (common within a GRPO group) are judged once.
    jobs: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for i, (pred, gold) in enumerate(zip(extracted, golds)):
      quick = _quick_verdict(pred, gold, config.integer_answers)
      if quick is None:
        jobs[(pred, gold)].append(i)
      else:
        correct[i] = quick
    timeouts = errors = 0
    if jobs:
      statuses = self._run(list(jobs), config)
      for key, status in statuses.items():
        rows = jobs[key]
        correct[rows] = status == _RIGHT
        failed[rows] = status in (_TIMEOUT, _ERROR)
        timeouts += len(rows) * (status == _TIMEOUT)
        errors += len(rows) * (status == _ERROR)
    well_formed &= ~failed
    rewards = correct.astype(np.float32) + np.float32(config.format_bonus) * well_formed
    return ScoreResult(rewards=rewards.astype(np.float32), correct=correct,
                       well_formed=well_formed, extracted=extracted,
                       timeouts=int(timeouts), errors=int(errors))

  def _run(self, keys: list[tuple[str, str]], config: RewardConfig) -> dict:
    """Statuses of (pred, gold) jobs, keyed by job; survives hung and dead workers."""
    with self._lock:
      if self._closed:
        raise RuntimeError("RewardPool: score() called after close()")
      batch = _Batch(keys, len(self._workers))
      try:
        while batch.pending or batch.busy:
          self._dispatch(batch, config)
          self._collect(batch, (self.timeout_s or config.timeout_s) + self.grace_s)
      except BaseException:
        for i in list(batch.busy):                    # their late results must not leak into
          self._replace(i)                            # the next call
        raise
      return {keys[j]: status for j, status in batch.statuses.items()}

  def _dispatch(self, batch: _Batch, config: RewardConfig) -> None:
    """Gives a chunk to every idle worker (replacing any that died while idle)."""
    for i, w in enumerate(self._workers):
      if i in batch.busy or not batch.pending:
        continue
      if not w.process.is_alive():
        self._replace(i)
        w = self._workers[i]
      chunk = batch.pending.popleft()
      try:
        w.conn.send((config.integer_answers, config.timeout_s, chunk))
      except (OSError, ValueError):
        batch.pending.appendleft(chunk)
        self._drain(batch, i)
        self._check_started(i)
        self._replace(i)
        continue
      w.chunk, w.done, w.since = chunk, 0, time.monotonic()
      batch.busy.add(i)

  def _drain(self, batch: _Batch, i: int) -> bool:
    """Records the results worker i has sent; False once its pipe is closed."""
    w = self._workers[i]
    try:
      while w.conn.poll():
        msg = w.conn.recv()
        if msg is None:
          w.ready, w.since = True, time.monotonic()  # the clock starts when it can work
          continue
        key, status = msg
        batch.statuses[key] = status
        w.done += 1
        w.since = time.monotonic()
    except (EOFError, OSError):
      return False
    if w.done == len(w.chunk):
      batch.busy.discard(i)
    return True

  def _check_started(self, i: int) -> None:
    """Raises when worker i died before it could start: replacing it would loop forever."""
    w = self._workers[i]
    if w.ready or w.process.is_alive():
      return
    w.process.join(timeout=5)
    raise RuntimeError(
        f"RewardPool: a worker died while starting (exit code {w.process.exitcode}); see its "
        "stderr. A script that creates a pool must guard its entry point with "
        "`if __name__ == '__main__':` (workers re-import the main module).")

  def _fail_current(self, batch: _Batch, i: int, status: int) -> None:
    """Scores worker i's running item `status`, re-queues the rest of its chunk, replaces it."""
    w = self._workers[i]
    self._drain(batch, i)
    self._check_started(i)
    if i in batch.busy:
      batch.statuses[w.chunk[w.done][0]] = status
      if w.done + 1 < len(w.chunk):
        batch.pending.appendleft(w.chunk[w.done + 1:])
      batch.busy.discard(i)
    self._replace(i)

  def _collect(self, batch: _Batch, limit_s: float) -> None:
    """Waits for results, a death, or the earliest per-item deadline, and handles it."""
    busy = sorted(batch.busy)
    if not busy:
      return
    deadline = lambda i: self._workers[i].since + (limit_s if self._workers[i].ready
                                                   else _STARTUP_LIMIT_S)
    wait_s = max(0.0, min(deadline(i) for i in busy) - time.monotonic())
    conns = {self._workers[i].conn: i for i in busy}
    sentinels = {self._workers[i].process.sentinel: i for i in busy}
    ready = multiprocessing.connection.wait([*conns, *sentinels], timeout=wait_s)
    dead = {sentinels[obj] for obj in ready if obj in sentinels}
    dead |= {conns[obj] for obj in ready if obj in conns and not self._drain(batch, conns[obj])}
    for i in sorted(dead):
      self._fail_current(batch, i, _ERROR)
    now = time.monotonic()
    for i in sorted(batch.busy):
      if now > deadline(i):
        self._fail_current(batch, i, _TIMEOUT)


class _Batch:
  """Book-keeping of one `score` call: queued chunks, busy worker slots, results so far."""

  def __init__(self, keys: list[tuple[str, str]], workers: int):
    size = max(1, min(256, math.ceil(len(keys) / (4 * workers))))
    # Sorted by gold: a worker then meets each gold in a run and parses it once.
    items = sorted(((j, pred, gold) for j, (pred, gold) in enumerate(keys)), key=lambda x: x[2])
    self.pending = collections.deque(items[k:k + size] for k in range(0, len(items), size))
    self.busy: set[int] = set()
    self.statuses: dict[int, int] = {}


def score(responses: Sequence[str], answers: Sequence[str], config: RewardConfig = RewardConfig(),
          pool: RewardPool | None = None) -> ScoreResult:
  """`pool.score(...)`, or with a temporary pool (seconds to start: keep one in a loop)."""
  if pool is not None:
    return pool.score(responses, answers, config)
  with RewardPool(workers=2) as temp:
    return temp.score(responses, answers, config)
