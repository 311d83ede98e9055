"""For plugin authors: :mod:`host.interfaces.tool_parser`, re-exported (the engine imports it from there)."""

from host.interfaces.tool_parser import (  # noqa: F401 - re-exported
    ExtractedToolCalls,
    PartialToolCalls,
    ToolCall,
    ToolCallStream,
    ToolParser,
    arguments_json,
    call_from_object,
    decode_sequence,
    hold_back_prefix,
    tool_call_id,
)
