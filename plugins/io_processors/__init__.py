"""Built-in IO processors (entry point ``host.io_processors: builtin_io``): ``text_chunks``
(:mod:`.text_chunks`: a long document embedded in overlapping windows, one vector per window
plus their mean; pooling models) and ``json_schema_extract`` (:mod:`.json_schema_extract`: a
text and a JSON schema in, the parsed JSON out, through structured outputs; generative models).
A request selects one on ``POST /pooling`` (``"io_processor": NAME``), or ``host serve
--io-processor NAME`` makes it the default (docs/pooling.md)."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_io_processors(register: Callable[..., None]) -> None:
    from host.plugins.io_processors.json_schema_extract import JSONSchemaExtractProcessor
    from host.plugins.io_processors.text_chunks import TextChunksProcessor

    register(TextChunksProcessor)
    register(JSONSchemaExtractProcessor)
