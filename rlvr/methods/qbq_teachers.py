"""QbQ's teachers: what turns seeds into variant rows (docs/methods.md#operators).

A row is {id, parent_id, operator, problem, answer, reason}; reason is
"accepted" or why the teacher's output was unusable (rejection against the
parent and earlier variants is the method's, after this). Teachers: an LLM
behind `complete(prompts) -> texts` (the policy itself, or any OpenAI-compatible
server: `server_teacher`), or the arithmetic task's procedural one.
"""

from __future__ import annotations

from typing import Callable, Sequence

from synthesis import qbq

Complete = Callable[[list[str]], list[str]]


def llm_variants(
  seeds: Sequence[qbq.Variant], complete: Complete, n_ops: int, integer_answers: bool
) -> list[dict]:
  """Plan (one call per seed) then generate (one call per seed and operator)."""
  plans = [
    qbq.parse_plan(text, n_ops)[0]
    for text in complete([qbq.plan_prompt(s.problem, n_ops) for s in seeds])
  ]
  jobs = [(s, op) for s, ops in zip(seeds, plans) for op in ops]
  texts = complete(
    [qbq.variant_prompt(s.problem, s.answer, op, integer_answer=integer_answers) for s, op in jobs]
  )
  out = []
  for (s, op), text in zip(jobs, texts):
    problem, answer, reason = qbq.parse_variant(text, integer_answers)
    out.append(
      dict(
        id=qbq.variant_id(s.id, op),
        parent_id=s.id,
        operator=op,
        problem=problem,
        answer=answer,
        reason=reason,
      )
    )
  return out


def procedural_variants(seeds: Sequence[qbq.Variant], n_ops: int, salt: str) -> list[dict]:
  """The arithmetic task's teacher (`rlvr.data.tasks.variants`): exact answers by construction."""
  from rlvr.data.tasks import variants as arith

  out = []
  for s in seeds:
    for op in arith.plan(s.problem, n_ops, salt):
      made = arith.variant(s.problem, s.answer, op, salt)
      out.append(
        dict(
          id=qbq.variant_id(s.id, op),
          parent_id=s.id,
          operator=op,
          problem=made[0] if made else None,
          answer=made[1] if made else None,
          reason="accepted" if made else "abstained",
        )
      )
  return out


def server_teacher(
  url: str, model: str, *, api_key: str | None, temperature: float, top_p: float, max_tokens: int
) -> Complete:
  """`complete` of a teacher behind an OpenAI-compatible server, checked to answer
  (AssistantError otherwise); the bearer token is `api_key`, else $VLLM_API_KEY."""
  from rlvr.sampling.assistant import Assistant

  teacher = Assistant(
    url, model, api_key=api_key, temperature=temperature, top_p=top_p, max_tokens=max_tokens
  )
  teacher.check()
  return teacher.complete
