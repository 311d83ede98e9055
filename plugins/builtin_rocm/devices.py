"""Which AMD GPUs a process sees: ``ROCR_VISIBLE_DEVICES``, then ``HIP_VISIBLE_DEVICES`` /
``CUDA_VISIBLE_DEVICES``.

The ROCm stack filters devices twice:

1. ROCr (the HSA runtime) exposes only the devices in ``ROCR_VISIBLE_DEVICES`` (physical ids,
   as ``amd-smi`` / ``rocm-smi`` number them), in that order.
2. The HIP runtime then keeps only the devices in ``HIP_VISIBLE_DEVICES``, whose entries are
   *indices into what ROCr exposed*, not physical ids. HIP also honours
   ``CUDA_VISIBLE_DEVICES`` for the same purpose; when both are set they must name the same
   list, since which one HIP applies differs across ROCm releases.

So torch ordinal ``i`` (``cuda:i`` on a HIP build) is physical device
``rocr[hip[i]]``, with either list standing for "all, in order" when its variable is unset.
Example: ``ROCR_VISIBLE_DEVICES=4,5,6,7`` and ``HIP_VISIBLE_DEVICES=1,3`` give ``cuda:0`` =
physical 5 and ``cuda:1`` = physical 7.

Only integer ids are accepted (no GPU UUIDs); an empty value hides every device. Anything
malformed is a ``ValueError`` naming the variable, its value and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

ROCR_VAR = "ROCR_VISIBLE_DEVICES"
HIP_VAR = "HIP_VISIBLE_DEVICES"
CUDA_VAR = "CUDA_VISIBLE_DEVICES"


def parse_id_list(var: str, raw: str) -> list[int]:
    """``"0,2"`` -> ``[0, 2]``; ``""`` -> ``[]`` (no device). Rejects anything else."""
    text = raw.strip()
    if text == "":
        return []
    ids: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item.isdigit():
            hint = " (GPU UUIDs are not supported; use the integer ids amd-smi lists)" if item.upper().startswith("GPU-") else ""
            raise ValueError(
                f"{var}={raw!r} is malformed: {item!r} is not a non-negative integer device id{hint}; "
                f"use a comma-separated list such as {var}=0,1"
            )
        ids.append(int(item))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{var}={raw!r} lists a device twice; list each device id once, e.g. {var}=0,1")
    return ids


@dataclass(frozen=True)
class RocmVisibility:
    """The two filters, parsed: ``rocr`` (physical ids ROCr exposes) and ``hip`` (indices into
    them that HIP keeps); ``None`` means the variable is unset, i.e. no filtering."""

    rocr: tuple[int, ...] | None = None
    hip: tuple[int, ...] | None = None
    hip_source: str = ""  # the variable(s) the HIP-level list came from, for messages

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RocmVisibility":
        env = os.environ if environ is None else environ
        rocr = parse_id_list(ROCR_VAR, env[ROCR_VAR]) if ROCR_VAR in env else None
        hip_list = parse_id_list(HIP_VAR, env[HIP_VAR]) if HIP_VAR in env else None
        cuda_list = parse_id_list(CUDA_VAR, env[CUDA_VAR]) if CUDA_VAR in env else None
        if hip_list is not None and cuda_list is not None and hip_list != cuda_list:
            raise ValueError(
                f"{HIP_VAR}={env[HIP_VAR]!r} and {CUDA_VAR}={env[CUDA_VAR]!r} disagree; the HIP runtime "
                f"honours both, so set only {HIP_VAR} (unset {CUDA_VAR}) or give them the same value"
            )
        hip = hip_list if hip_list is not None else cuda_list
        source = " and ".join(v for v, lst in ((HIP_VAR, hip_list), (CUDA_VAR, cuda_list)) if lst is not None)
        if rocr is not None and hip:
            beyond = [i for i in hip if i >= len(rocr)]
            if beyond:
                raise ValueError(
                    f"{source}={','.join(map(str, hip))} indexes past the {len(rocr)} device(s) that "
                    f"{ROCR_VAR}={env[ROCR_VAR]!r} leaves visible: HIP ids count the devices ROCr "
                    f"exposes (0..{len(rocr) - 1}), not physical ids"
                )
        return cls(
            rocr=None if rocr is None else tuple(rocr),
            hip=None if hip is None else tuple(hip),
            hip_source=source,
        )

    def hidden_by(self) -> str:
        """The setting that hides every device, or ``""`` when some may be visible."""
        if self.rocr is not None and not self.rocr:
            return f'{ROCR_VAR}=""'
        if self.hip is not None and not self.hip:
            return f'{self.hip_source}=""'
        return ""

    def physical_ids(self) -> list[int] | None:
        """Physical id of each torch ordinal, in ordinal order; ``None`` when nothing is
        filtered (ordinal ``i`` is physical ``i``)."""
        if self.rocr is None and self.hip is None:
            return None
        if self.hip is None:
            return list(self.rocr or ())
        if self.rocr is None:
            return list(self.hip)
        return [self.rocr[i] for i in self.hip]

    def describe(self) -> str:
        parts = []
        if self.rocr is not None:
            parts.append(f"{ROCR_VAR}={','.join(map(str, self.rocr))}")
        if self.hip is not None:
            parts.append(f"{self.hip_source}={','.join(map(str, self.hip))}")
        return " then ".join(parts) if parts else "no visibility variable set"
