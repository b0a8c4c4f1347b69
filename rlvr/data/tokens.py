"""Text from outside the policy as tokens: special-token strings stay plain text.

A problem statement, a dataset row, a tool's output or a user environment's text may hold
the characters of a control token ("<|im_end|>", "<|eot_id|>"). Encoded the usual way,
`tokenizer(text)` turns them into the control token itself, and the text forges a turn the
policy never saw end. `encode_plain` encodes such strings as the ordinary characters they
are (the tokenizer's `split_special_tokens`; where a tokenizer ignores it, each
special-token string is split before its first character), so the only special ids in a
sequence are the chat template's own markers (`rlvr.data.prompts.format_prompt`) and the
ones the policy sampled. Text is made valid Unicode first (`sanitize`): a lone surrogate
becomes U+FFFD instead of an encoder's exception.

`decode_marked` is the other direction for people: the text a sequence of ids shows, with
each special id written as ⟦<|im_end|>⟧, so a control token and text that looks like one
can be told apart (the samples files).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MARK_OPEN, MARK_CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧ around a special id in `decode_marked`


def sanitize(text) -> str:
  """`text` as valid Unicode: lone surrogates become U+FFFD (pairs are joined); anything
  that is not a string is shown by its repr."""
  if not isinstance(text, str):
    text = repr(text)
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def special_tokens(tokenizer) -> dict[str, int]:
  """The tokenizer's special tokens, string -> id: its named ones (eos, pad, ...) and
  every added token marked special."""
  cached = getattr(tokenizer, "_rlvr_special_tokens", None)
  if cached is not None:
    return cached
  out: dict[str, int] = {}
  for tok in getattr(tokenizer, "all_special_tokens", ()) or ():
    i = tokenizer.convert_tokens_to_ids(tok)
    if isinstance(i, int) and tok:
      out[str(tok)] = i
  decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
  for i, added in decoder.items():
    if getattr(added, "special", False) and str(added):
      out[str(added)] = int(i)
  try:
    tokenizer._rlvr_special_tokens = out
  except AttributeError:  # a tokenizer object that takes no attributes: computed each time
    pass
  return out


def special_ids(tokenizer) -> frozenset[int]:
  return frozenset(special_tokens(tokenizer).values())


def holds_special_text(tokenizer, text: str) -> bool:
  """Whether `text` contains the string of one of the tokenizer's special tokens."""
  return any(s in text for s in special_tokens(tokenizer))


def _ids(tokenizer, text: str, add_special_tokens: bool, split: bool) -> list[int]:
  kw = {"split_special_tokens": True} if split else {}
  enc = tokenizer(text, add_special_tokens=add_special_tokens, **kw)
  return [int(t) for t in enc["input_ids"]]


def encode_plain(tokenizer, text, add_special_tokens: bool = False) -> list[int]:
  """Token ids of `text` as plain text: a special token's string is encoded as its
  characters, never as the special id. add_special_tokens: the tokenizer's own additions
  around the text (a BOS), which are the only special ids the result may hold."""
  text = sanitize(text)
  if not holds_special_text(tokenizer, text):
    return _ids(tokenizer, text, add_special_tokens, split=False)
  ids = _ids(tokenizer, text, add_special_tokens, split=True)
  added = _ids(tokenizer, "", True, split=False) if add_special_tokens else []
  if count_special(tokenizer, ids) <= len(added):
    return ids
  # A tokenizer without split_special_tokens: break each special string before its first
  # character (what follows the break is searched again).
  return _split_encode(tokenizer, text, add_special_tokens)


def _split_encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
  specials = sorted(special_tokens(tokenizer), key=len, reverse=True)
  pieces, rest = [], text
  while rest:
    hits = [(rest.find(s), s) for s in specials if s in rest]
    if not hits:
      pieces.append(rest)
      break
    at, s = min(hits, key=lambda h: (h[0], -len(h[1])))
    pieces += [rest[:at], s[:1]]
    rest = rest[at + 1 :]
  body = [i for p in pieces if p for i in _ids(tokenizer, p, False, split=False)]
  if not add_special_tokens:
    return body
  core, full = _ids(tokenizer, "a", False, False), _ids(tokenizer, "a", True, False)
  at = next(k for k in range(len(full) - len(core) + 1) if full[k : k + len(core)] == core)
  return full[:at] + body + full[at + len(core) :]  # what the tokenizer adds around text


def encode_markers(tokenizer, text: str) -> list[int]:
  """Token ids of text the library itself writes around outside text (a chat template's
  markers, an environment's declared wrap): its special-token strings are special ids."""
  return _ids(tokenizer, text, False, split=False)


def count_special(tokenizer, ids: Iterable[int]) -> int:
  specials = special_ids(tokenizer)
  return sum(int(i) in specials for i in ids)


def decode_marked(tokenizer, ids: Sequence[int]) -> str:
  """The text of `ids` with each special id shown as ⟦<token>⟧ (never dropped)."""
  specials = special_ids(tokenizer)
  out: list[str] = []
  run: list[int] = []
  for i in ids:
    i = int(i)
    if i in specials:
      if run:
        out.append(tokenizer.decode(run))
        run = []
      out.append(f"{MARK_OPEN}{tokenizer.convert_ids_to_tokens(i)}{MARK_CLOSE}")
    else:
      run.append(i)
  if run:
    out.append(tokenizer.decode(run))
  return "".join(out)
