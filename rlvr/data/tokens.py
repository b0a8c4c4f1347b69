"""Text from outside the policy as tokens: control-token strings stay plain text.

A problem statement, a dataset row, a tool's output or a user environment's text may hold
the characters of a control token: a special one ("<|im_end|>", "<|eot_id|>") or an added
one that is not special ("<think>", "<tool_call>"). Encoded the usual way,
`tokenizer(text)` turns them into the token itself, and the text forges a turn the policy
never saw end, a tool call or a thought the policy never wrote. `encode_plain` encodes such
strings as the ordinary pieces of their characters, as the model reads them typed: the
whole text through the tokenizer without those tokens (a fast tokenizer's backend; a slow
one's `split_special_tokens`; otherwise each control string is split before its first
character). So the only control ids in a sequence are the chat template's own
(`rlvr.data.prompts.format_prompt`), those of an environment's declared `wrap`
(`encode_markers`) and the ones the policy sampled. An added token that is only whitespace
(a run of spaces some families add for code) is the text's own token and stays it. Text is
made valid Unicode first (`sanitize`): a lone surrogate becomes U+FFFD instead of an
encoder's exception.

`decode_marked` is the other direction for people: the text a sequence of ids shows, with
each special id written as ⟦<|im_end|>⟧, so a control token and text that looks like one
can be told apart (the samples files).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

MARK_OPEN, MARK_CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧ around a special id in `decode_marked`
_PROBE = "Say 42, then stop.\n"  # text without control strings: a backend copy must agree


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


def _cached(tokenizer, name: str, make: Callable):
  """`make()`, kept on the tokenizer as `name` (computed each time on a tokenizer object
  that takes no attributes)."""
  out = getattr(tokenizer, name, None)
  if out is None:
    out = make()
    try:
      setattr(tokenizer, name, out)
    except AttributeError:
      pass
  return out


def special_tokens(tokenizer) -> dict[str, int]:
  """The tokenizer's special tokens, string -> id: its named ones (eos, pad, ...) and
  every added token marked special."""

  def make() -> dict[str, int]:
    out: dict[str, int] = {}
    for tok in getattr(tokenizer, "all_special_tokens", ()) or ():
      i = tokenizer.convert_tokens_to_ids(tok)
      if isinstance(i, int) and tok:
        out[str(tok)] = i
    for i, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
      if getattr(added, "special", False) and str(added):
        out[str(added)] = int(i)
    return out

  return _cached(tokenizer, "_rlvr_special_tokens", make)


def control_tokens(tokenizer) -> dict[str, int]:
  """The strings outside text must not turn into, string -> id: the special tokens and
  every other added token ("<think>", "<tool_call>") that is not only whitespace."""

  def make() -> dict[str, int]:
    out = dict(special_tokens(tokenizer))
    for i, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
      if str(added).strip():
        out.setdefault(str(added), int(i))
    return out

  return _cached(tokenizer, "_rlvr_control_tokens", make)


def special_ids(tokenizer) -> frozenset[int]:
  return frozenset(special_tokens(tokenizer).values())


def holds_special_text(tokenizer, text: str) -> bool:
  """Whether `text` contains the string of one of the tokenizer's control tokens (special
  or added: `control_tokens`)."""
  return any(s in text for s in control_tokens(tokenizer))


def _ids(tokenizer, text: str, add_special_tokens: bool, split: bool) -> list[int]:
  kw = {"split_special_tokens": True} if split else {}
  enc = tokenizer(text, add_special_tokens=add_special_tokens, **kw)
  return [int(t) for t in enc["input_ids"]]


def encode_plain(tokenizer, text, add_special_tokens: bool = False) -> list[int]:
  """Token ids of `text` as plain text: a control token's string (special or added) is
  encoded as the ordinary pieces of its characters, never as the token's id.
  add_special_tokens: the tokenizer's own additions around the text (a BOS), which are the
  only control ids the result may hold."""
  text = sanitize(text)
  if not holds_special_text(tokenizer, text):
    return _ids(tokenizer, text, add_special_tokens, split=False)
  own = len(_ids(tokenizer, "", True, split=False)) if add_special_tokens else 0
  for encode in (_backend_ids, _unsplit_ids):
    ids = encode(tokenizer, text, add_special_tokens)
    if ids is not None and _count_control(tokenizer, ids) <= own:
      return ids
  # No encoder that leaves the control strings alone: break each before its first
  # character (what follows the break is searched again).
  return _split_encode(tokenizer, text, add_special_tokens)


def _backend_ids(tokenizer, text: str, add_special_tokens: bool) -> list[int] | None:
  """`text` through a fast tokenizer's backend with its control tokens taken out (None
  for a tokenizer without a backend, or one whose copy does not encode as it does)."""
  backend = _cached(tokenizer, "_rlvr_uncontrolled", lambda: _uncontrolled(tokenizer))
  if not backend:
    return None
  return list(backend.encode(text, add_special_tokens=add_special_tokens).ids)


def _uncontrolled(tokenizer):
  """A copy of the tokenizer's backend (`tokenizers.Tokenizer`) without its control tokens
  as added tokens (its vocabulary, normalizer, pre-tokenizer and BOS/EOS additions as they
  are), or False where there is none or it disagrees with the tokenizer on `_PROBE`."""
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None:
    return False
  from tokenizers import Tokenizer

  spec = json.loads(backend.to_str())
  control = control_tokens(tokenizer)
  spec["added_tokens"] = [t for t in spec.get("added_tokens") or () if t["content"] not in control]
  spec["truncation"] = spec["padding"] = None
  copy = Tokenizer.from_str(json.dumps(spec))
  for add in (False, True):
    if copy.encode(_PROBE, add_special_tokens=add).ids != _ids(tokenizer, _PROBE, add, False):
      return False
  return copy


def _unsplit_ids(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
  """The tokenizer's `split_special_tokens` (a slow tokenizer's leaves every added token's
  string unsplit)."""
  return _ids(tokenizer, text, add_special_tokens, split=True)


def _split_encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
  controls = sorted(control_tokens(tokenizer), key=len, reverse=True)
  pieces, rest = [], text
  while rest:
    hits = [(rest.find(s), s) for s in controls if s in rest]
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
  markers, an environment's declared wrap): its control-token strings are their ids."""
  return _ids(tokenizer, text, False, split=False)


def count_special(tokenizer, ids: Iterable[int]) -> int:
  specials = special_ids(tokenizer)
  return sum(int(i) in specials for i in ids)


def _count_control(tokenizer, ids: Iterable[int]) -> int:
  controls = frozenset(control_tokens(tokenizer).values())
  return sum(int(i) in controls for i in ids)


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
