"""What a run wrote, read back as a user sees it: the terminal's lines, TensorBoard's scalars."""

from __future__ import annotations

import os


def screen(text: str) -> list[str]:
  """Lines as a terminal shows them: within a line, text after a carriage return
  overwrites what is there (a progress bar redrawn, or cleared with spaces)."""
  lines = []
  for raw in text.split("\n"):
    line = ""
    for part in raw.split("\r"):
      line = part + line[len(part) :]
    lines.append(line.rstrip())
  return lines


def tensorboard_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} over the events files of `logdir` in file-name order, as
  TensorBoard reads them: records of (u64 length, u32 crc, Event protobuf, u32 crc)."""
  from tensorboardX.proto import event_pb2

  out = {}
  for name in sorted(os.listdir(logdir)):
    with open(os.path.join(logdir, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      n = int.from_bytes(data[pos : pos + 8], "little")
      event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
      pos += 12 + n + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, round(v.simple_value, 6)))
  return out
