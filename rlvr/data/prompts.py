"""The prompt the policy sees: a problem, the run's solving instruction, the chat template."""

from __future__ import annotations

from collections.abc import Mapping

from rlvr.data import chat_templates, tokens

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

  The problem is text from outside the policy: a special token's string in it stays plain
  text (`rlvr.data.tokens`); the only special ids are the template's own markers.

  transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True),
  older versions a plain list; both end up as a list of Python ints.
  """
  text = tokens.sanitize(user_message(problem, instruction))
  if chat_templates.is_raw(chat_template):
    return tokens.encode_plain(tokenizer, text, add_special_tokens=True)
  template = chat_templates.source(chat_template)
  if template is None and not getattr(tokenizer, "chat_template", None):
    raise ValueError(
      f"{chat_templates.FIELD}: the tokenizer has no chat template of its own; choose one "
      f"(chatml, a Jinja file) or {chat_templates.NONE!r} for the prompt text as it is"
    )
  if tokens.holds_special_text(tokenizer, text):
    return _with_plain_content(tokenizer, text, template, chat_template)
  ids = _render(tokenizer, text, template, chat_template, tokenize=True)
  if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
    ids = ids["input_ids"]
  return [int(t) for t in ids]


def _render(tokenizer, content: str, template, chat_template: str, tokenize: bool):
  import jinja2  # what transformers renders templates with

  messages = [{"role": "user", "content": content}]
  try:
    return tokenizer.apply_chat_template(
      messages, chat_template=template, add_generation_prompt=True, tokenize=tokenize
    )
  except jinja2.TemplateError as e:
    which = repr(chat_template) if template is not None else "the tokenizer's template"
    raise ValueError(
      f"{chat_templates.FIELD}: {which} does not render: {type(e).__name__}: {e}"
    ) from None


_SLOT = "\x00rlvr-message\x00"  # stands for the message while the template renders


def _with_plain_content(tokenizer, text: str, template, chat_template: str) -> list[int]:
  """The prompt of a message that holds special-token strings: the template rendered around
  a placeholder, its text encoded with its markers, the message as plain text."""
  rendered = _render(tokenizer, _SLOT, template, chat_template, tokenize=False)
  if not isinstance(rendered, str) or rendered.count(_SLOT) != 1:
    which = repr(chat_template) if template is not None else "the tokenizer's template"
    raise ValueError(
      f"{chat_templates.FIELD}: {which} does not show the message as given, so a special "
      "token's text in it cannot be kept as text"
    )
  head, tail = rendered.split(_SLOT)
  plain = tokens.encode_plain(tokenizer, text)
  return tokens.encode_markers(tokenizer, head) + plain + tokens.encode_markers(tokenizer, tail)
