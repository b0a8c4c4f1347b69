"""ChatML without a default system turn (Qwen's turn markers): the template the tiny models'
tokenizers carry (`rlvr.model.make_tiny`) and the built-in `data.chat_template=chatml`."""

CHATML = (
  "{%- for message in messages %}"
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
  "{%- endfor %}"
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
