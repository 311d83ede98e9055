"""``--lora-modules`` values (process 0): ``name=path`` or vLLM's JSON form."""

from __future__ import annotations

import json

from host.contracts.lora_request import LoRARequest

FORMS = "use name=/path/to/adapter or '{\"name\": \"sql\", \"path\": \"/path/to/adapter\"}'"


def lora_requests_from_modules(values: list[str]) -> list[LoRARequest]:
    """One :class:`LoRARequest` per ``--lora-modules`` value, ids 1, 2, ... in order; a
    malformed value or a name given twice is a ``ValueError`` naming it and both forms."""
    out: list[LoRARequest] = []
    for text in values:
        text = text.strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"--lora-modules {text!r} is not valid JSON ({e}); {FORMS}") from None
            unknown = sorted(set(spec) - {"name", "path", "base_model_name"})
            if unknown:
                raise ValueError(f"--lora-modules {text!r} has unknown keys {unknown}; known keys: name, path, base_model_name")
            name, path = spec.get("name"), spec.get("path")
        else:
            name, sep, path = (part.strip() for part in text.partition("="))
            if not sep:
                raise ValueError(f"--lora-modules {text!r} is not name=path; {FORMS}")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise ValueError(f"--lora-modules {text!r} needs a non-empty name and path; {FORMS}")
        if any(r.lora_name == name for r in out):
            raise ValueError(f"--lora-modules names {name!r} twice; give each adapter its own name")
        out.append(LoRARequest(name, len(out) + 1, path))
    return out
