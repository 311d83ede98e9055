"""The JSON-lines sink (``--stat-loggers jsonl:PATH``): every record as one JSON object per line,
appended to ``PATH``. It runs in the API process.

Each line is ``{"time": <unix seconds>, "engine": 0, "scheduler": {...} | null,
"iteration": {...} | null}``, with the fields of
:class:`~host.sdk.stat_logger.IterationStats` (its finished requests included) and of the
scheduler stats. The file is line-buffered, so a line is on disk when ``record`` returns.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from host.sdk import StatLogger


def _plain(obj: Any) -> Any:
    if obj is None:
        return None
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    fields = getattr(obj, "__struct_fields__", None)  # a msgspec Struct (the scheduler stats)
    if fields is not None:
        return {f: getattr(obj, f) for f in fields}
    return obj


class JsonlStatLogger(StatLogger):
    name = "jsonl"
    enabled_by_default = False
    argument = "PATH: the file the JSON lines are appended to"

    def __init__(self, context: Any = None, arg: str | None = None) -> None:
        super().__init__(context, arg)
        if not arg:
            raise ValueError("stat logger 'jsonl' needs a file: write --stat-loggers jsonl:PATH")
        path = os.path.abspath(os.path.expanduser(arg))
        try:
            self._file = open(path, "a", buffering=1, encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"stat logger 'jsonl' cannot open {path!r} for appending ({exc.strerror}); pick a writable path") from exc
        self.path = path

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        line = {
            "time": time.time(),
            "engine": self.engine_index,
            "scheduler": _plain(scheduler_stats),
            "iteration": _plain(iteration_stats),
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def shutdown(self) -> None:
        if not self._file.closed:
            self._file.close()
