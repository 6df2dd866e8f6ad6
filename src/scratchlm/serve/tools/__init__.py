"""Tool calling: OpenAI `tools` / `tool_choice` in, the model family's own tool-call text out, parsed back
into OpenAI `tool_calls`.

Formats (chosen from the chat template's text):
    hermes       (Qwen2/2.5/3, Hermes, and scratchlm's ChatML):  <tool_call>\\n{"name": F, "arguments": {...}}\\n</tool_call>
                 one block per call; text before the first block is the message content
    llama3_json  (Llama 3.1+):  [<|python_tag|>]{"name": F, "parameters": {...}} (several joined by ";")
                 the whole reply is the call(s), or it is content
The tools reach the prompt through the template (`tools=` as transformers passes them). A model without a
template of its own (scratchlm's ChatML) gets them as a system message in the hermes format
(`chatml_tool_messages`); a template that never mentions tools is refused (the model would not see them).

tool_choice: "none" (tools shown, replies are plain content), "auto" (parse whatever the model writes),
"required" or {"type": "function", "function": {"name": F}}: the constrained decoder forces exactly one
call, to one of the tools (or to F), with arguments valid under that tool's parameters schema (the JSON
Schema subset of generate/constrained/schema.py).

    plan.py       the request's ToolPlan: tools / tool_choice validated, the format read from the template
    grammar.py    the constrained decoder's grammar of one forced call
    messages.py   OpenAI messages -> what chat templates expect (and ChatML's tool system message)
    stream.py     a streamed choice: content shown until a call may begin, then held
    parse.py      reply text -> (content, OpenAI tool_calls)
"""

from scratchlm.serve.tools.grammar import call_grammar
from scratchlm.serve.tools.messages import chatml_tool_messages, template_messages
from scratchlm.serve.tools.parse import parse_tool_calls
from scratchlm.serve.tools.plan import HERMES, LLAMA3, ToolPlan, plan_tools, tool_format
from scratchlm.serve.tools.stream import ToolStream

__all__ = ["HERMES", "LLAMA3", "ToolPlan", "ToolStream", "call_grammar", "chatml_tool_messages", "parse_tool_calls",
           "plan_tools", "template_messages", "tool_format"]
