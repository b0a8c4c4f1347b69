"""What a vLLM server answers, read defensively: the client's errors (`SamplerError` and its
kinds) and the parsers of a `/v1/completions` response (`parse_completion_response`) and of
its routed experts (`parse_routes`). Every field is checked; a missing or malformed one is
a `MalformedResponseError` naming it."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Sequence

import numpy as np

from rlvr.sampling import http
from rlvr.sampling.types import Completion


class SamplerError(RuntimeError):
  """A server could not serve a request within the retry budget (names the server)."""


class EngineDeadError(SamplerError):
  """The server answers HTTP but its engine is dead: restart it."""


class MalformedResponseError(SamplerError):
  """The server's answer lacks fields the client needs (names the field)."""


class RequestAbortedError(SamplerError, http.Aborted):
  """The server dropped the request (finish_reason "abort", e.g. while shutting down);
  raised inside a try, it makes the HTTP core try again."""


def parse_routes(encoded: Any, where: str, n_tokens: int, sparse_layers: Sequence[int], k: int):
  """A choice's `routed_experts` (vLLM's routed-expert capture: base64 of a .npy array
  [prompt + completion - 1, all layers, k], the experts of every fed token, dense layers as
  zeros) in `Completion.routes`' layout: int32 [n_tokens, sparse layers, k], -1 on the
  completion's last token (never fed). Raises MalformedResponseError naming the choice."""
  try:
    routes = np.load(io.BytesIO(base64.b64decode(encoded, validate=True)), allow_pickle=False)
  except (binascii.Error, ValueError, TypeError, OSError) as e:
    raise MalformedResponseError(f"{where}.routed_experts: not a base64 .npy array ({e})") from None
  want = (n_tokens - 1, max(sparse_layers) + 1, k)
  if (
    routes.ndim != 3
    or routes.shape[0] != want[0]
    or routes.shape[1] < want[1]
    or routes.shape[2] != k
    or routes.dtype.kind not in "iu"
  ):
    raise MalformedResponseError(
      f"{where}.routed_experts: {routes.dtype}{list(routes.shape)} for {n_tokens} tokens, "
      f"expected [{want[0]}, >= {want[1]} layers, {k}] integers"
    )
  out = np.full((n_tokens, len(sparse_layers), k), -1, np.int32)
  out[:-1] = routes[:, list(sparse_layers)]
  return out


def parse_completion_response(
  body: Any,
  n: int,
  want_logprobs: bool,
  stop_ids: set[int],
  version: int | None,
  routing: tuple[int, Sequence[int], int] | None = None,
) -> list[Completion]:
  """Turns a `/v1/completions` JSON body into `n` Completions, or raises
  MalformedResponseError naming what is missing or wrong. routing: (prompt tokens, the
  sparse layers, experts per token) of a mixture-of-experts policy; a choice that carries
  `routed_experts` (a server started with routed-expert capture) then gets its routes."""
  if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
    raise MalformedResponseError(f"response has no 'choices' list: {str(body)[:200]}")
  choices = sorted(body["choices"], key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
  for j, c in enumerate(choices):  # an aborted request may come back with fewer choices
    if isinstance(c, dict) and c.get("finish_reason") == "abort":
      raise RequestAbortedError(f"choices[{j}]: request aborted by the server")
  if len(choices) != n:
    raise MalformedResponseError(f"expected {n} choices, got {len(choices)}")
  out = []
  for j, c in enumerate(choices):
    if not isinstance(c, dict):
      raise MalformedResponseError(f"choices[{j}] is not an object")
    ids = c.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
      raise MalformedResponseError(
        f"choices[{j}].token_ids missing or not a list of ints "
        "(server needs return_token_ids support)"
      )
    lps = None
    if want_logprobs:
      lp = c.get("logprobs")
      lps = lp.get("token_logprobs") if isinstance(lp, dict) else None
      if not isinstance(lps, list) or len(lps) != len(ids):
        raise MalformedResponseError(
          f"choices[{j}].logprobs.token_logprobs missing or of length "
          f"{len(lps) if isinstance(lps, list) else 'n/a'} for {len(ids)} tokens"
        )
      if any(not isinstance(x, (int, float)) for x in lps):
        raise MalformedResponseError(f"choices[{j}].logprobs.token_logprobs has non-numbers")
      lps = tuple(float(x) for x in lps)
    reason = c.get("finish_reason")
    if reason not in ("stop", "length"):
      raise MalformedResponseError(f"choices[{j}].finish_reason: unexpected {reason!r}")
    routes = None
    if routing is not None and c.get("routed_experts") is not None:
      prompt_len, sparse_layers, k = routing
      routes = parse_routes(
        c["routed_experts"], f"choices[{j}]", prompt_len + len(ids), sparse_layers, k
      )
    out.append(
      Completion(
        token_ids=tuple(ids),
        logprobs=lps,
        text=c.get("text") or "",
        finish_reason=reason,
        weight_version=version,
        routes=routes,
      )
    )
  return out
