"""Lines printed while a progress bar (tqdm, on stderr) is drawn.

Text written to the terminal while a bar is drawn lands inside the bar's line. `say` prints
a line above the bars (tqdm clears them, prints, draws them again); `messages_above_bars`
does the same for log records and Python warnings while it is active; `close_bars` ends the
open bars, their last state left on screen, before a closing message.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from typing import Iterator


def say(text: str) -> None:
  """One line on stderr, above any progress bar."""
  from tqdm import tqdm

  tqdm.write(text, file=sys.stderr)
  sys.stderr.flush()


def close_bars() -> int:
  """Closes every open progress bar (a bar kept on screen ends its line); how many."""
  from tqdm import tqdm

  bars = list(getattr(tqdm, "_instances", ()))
  for bar in bars:
    bar.close()
  return len(bars)


class _AboveBars(logging.Handler):
  """A handler that clears the progress bars around the one it wraps."""

  def __init__(self, inner: logging.Handler):
    super().__init__(inner.level)
    self.inner = inner

  def handle(self, record: logging.LogRecord):
    from tqdm import tqdm

    with tqdm.external_write_mode(file=sys.stderr):
      return self.inner.handle(record)

  def emit(self, record: logging.LogRecord) -> None:
    self.inner.emit(record)


@contextlib.contextmanager
def messages_above_bars() -> Iterator[None]:
  """Log records (the root logger's handlers, absl's included) and Python warnings print
  above the progress bars while the block runs."""
  from tqdm import tqdm

  root = logging.getLogger()
  show = warnings.showwarning

  def _show(*args, **kwargs):
    with tqdm.external_write_mode(file=sys.stderr):
      show(*args, **kwargs)

  root.handlers = [_AboveBars(h) for h in root.handlers]
  warnings.showwarning = _show
  try:
    yield
  finally:
    root.handlers = [h.inner if isinstance(h, _AboveBars) else h for h in root.handlers]
    warnings.showwarning = show
