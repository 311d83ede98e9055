"""Tools in the prompt for a chat template that does not render them itself.

A template that never mentions ``tools`` (SmolLM2's, for one) would drop the request's tools
and the assistant turns' ``tool_calls`` silently. For such a template the conversation is
rewritten before rendering, in the Hermes convention the ``hermes`` parser reads: a system
message lists the tools' signatures and asks for ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
an assistant turn's calls become such blocks in its content; ``tool`` messages stay as they are
(every template renders a role and a content).
"""

from __future__ import annotations

import json
from typing import Any


def template_renders_tools(tokenizer: Any, kwargs: dict[str, Any], server_template: str | None = None) -> bool:
    """Whether the template in use refers to ``tools``: the request's own (which counts as one
    that does), else the server's ``--chat-template``, else the tokenizer's."""
    if kwargs.get("chat_template") is not None:
        return True
    template = server_template if server_template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return isinstance(template, str) and "tools" in template


def tool_system_prompt(tools: list[dict[str, Any]]) -> str:
    signatures = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to assist with the user query. The functions you can call are, "
        f"as JSON signatures within <tools></tools>:\n<tools>\n{signatures}\n</tools>\n"
        "For each function call, return a JSON object with the function name and arguments within "
        '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def with_tools_in_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` (already normalized) with the tools in the system message and each
    assistant turn's ``tool_calls`` written out as ``<tool_call>`` blocks."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            blocks = [
                "<tool_call>\n" + json.dumps(
                    {"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments", {})},
                    ensure_ascii=False,
                ) + "\n</tool_call>"
                for c in calls
            ]
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        out.append(m)
    if tools:
        prompt = tool_system_prompt(tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
