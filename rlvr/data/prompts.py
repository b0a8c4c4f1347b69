"""The prompt the policy sees: a problem, the run's solving instruction, the chat template."""

from __future__ import annotations

from collections.abc import Mapping

from rlvr.data import chat_templates

# The solving instruction of the Qwen2.5-Math evaluations the papers report (so held-out
# figures compare); appended to every problem unless the caller passes another.
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# The code domain's (our wording): the response's last python block is the program run.
CODE_INSTRUCTION = (
  "Think the problem through, then write the complete solution in Python in one ```python "
  "code block at the end of your response."
)


def user_message(problem: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
  return f"{problem}\n\n{instruction}" if instruction else problem


def format_prompt(
  tokenizer, problem: str, instruction: str = DEFAULT_INSTRUCTION, chat_template: str = ""
) -> list[int]:
  """Token ids of the prompt the policy sees: the user turn (problem and instruction) in the
  chat template `chat_template` names (`rlvr.data.chat_templates`: "" the tokenizer's own, "none"
  the text as it is, "chatml", a Jinja file), ending with the assistant header.

  transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True),
  older versions a plain list; both end up as a list of Python ints.
  """
  text = user_message(problem, instruction)
  if chat_templates.is_raw(chat_template):
    return [int(t) for t in tokenizer(text)["input_ids"]]
  template = chat_templates.source(chat_template)
  if template is None and not getattr(tokenizer, "chat_template", None):
    raise ValueError(
      f"{chat_templates.FIELD}: the tokenizer has no chat template of its own; choose one "
      f"(chatml, a Jinja file) or {chat_templates.NONE!r} for the prompt text as it is"
    )
  import jinja2  # what transformers renders templates with

  messages = [{"role": "user", "content": text}]
  try:
    ids = tokenizer.apply_chat_template(
      messages, chat_template=template, add_generation_prompt=True, tokenize=True
    )
  except jinja2.TemplateError as e:
    which = repr(chat_template) if template is not None else "the tokenizer's template"
    raise ValueError(
      f"{chat_templates.FIELD}: {which} does not render: {type(e).__name__}: {e}"
    ) from None
  if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
    ids = ids["input_ids"]
  return [int(t) for t in ids]
