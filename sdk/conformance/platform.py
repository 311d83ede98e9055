"""The platform suite: detection that never raises, a valid device type, a describable platform."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from host.sdk.conformance.base import RegistrationCheck
from host.sdk.platform import Platform

_DTYPES = {"float32", "bfloat16", "float16", "float64"}


class PlatformConformance(RegistrationCheck):
    """Set ``platform`` (the :class:`Platform` subclass)."""

    platform: ClassVar[type[Platform] | None] = None
    registry_kind = "platforms"
    group = "host.platforms"

    def registered_name(self) -> str:
        return self.platform.name

    def test_has_a_name_and_a_torch_device_type(self) -> None:
        import torch

        assert self.platform is not None, "set `platform` to your Platform subclass"
        assert self.platform.name and self.platform.name != "unspecified", "set the class field `name`"
        torch.device(self.platform.device_type)  # raises for a device type torch does not know
        assert set(self.platform.supported_dtypes) <= _DTYPES, f"supported_dtypes {self.platform.supported_dtypes} names unknown dtypes"
        assert all(isinstance(n, str) for n in self.platform.attention_backend_priority)

    def test_detect_answers_a_bool_and_a_reason_without_raising(self) -> None:
        found = self.platform.detect()
        assert isinstance(found, bool), f"detect() must return a bool, got {found!r}"
        assert isinstance(self.platform.detection_reason(), str)

    def test_describe_is_json(self) -> None:
        described: dict[str, Any] = self.platform().describe()
        json.dumps(described)
        assert described.get("name") == self.platform.name

    def test_the_worker_class_resolves(self) -> None:
        from host.sdk.runtime import resolve_qualname

        assert isinstance(resolve_qualname(self.platform.worker_cls), type), f"worker_cls {self.platform.worker_cls!r} is not a class"

    def test_a_present_platform_reports_its_memory(self) -> None:
        if not self.platform.detect():
            return  # nothing to ask of hardware that is not here
        total = self.platform().get_device_total_memory(0)
        assert isinstance(total, int) and total > 0, f"get_device_total_memory(0) = {total!r}; must be bytes > 0"
