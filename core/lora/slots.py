"""Where adapters live on a worker: ``max_loras`` device slots in front of a CPU tier of
``max_cpu_loras`` adapters, both least-recently-used.

An adapter is keyed by ``(lora_int_id, digest)`` (:attr:`LoRARequest.key`), so the same id with
changed files is another adapter: it is read again and never served from a stale slot. A request
still queued with an older digest when its files changed runs with the files as they are then
(the old weights are gone; a warning says so).
:meth:`LoRASlots.activate` makes one step's adapters resident: one already in a slot is only
touched; another takes a free slot, else the least recently used slot whose adapter the step
does not use (it stays in the CPU tier). Its tensors come from the CPU tier, or are read from
its directory into it first, evicting the CPU tier's least recently used adapter beyond
``max_cpu_loras`` (preferring one that is not in a slot). A step with more than ``max_loras``
distinct adapters is a ``ValueError`` (the scheduler never plans one).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch

from host.contracts.lora_request import LoRARequest
from host.core.lora.adapter import read_adapter
from host.core.lora.layers import LoRALinear
from host.core.lora.punica import LoRAMapping, build_mapping

logger = logging.getLogger("host.lora")

Key = tuple[int, str]


@dataclass
class CPUAdapter:
    """One adapter's tensors in CPU memory, grouped by layer: ``{layer: {module: (A, B)}}``."""

    name: str
    scale: float
    rank: int
    layers: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]]


class LoRASlots:
    """The device slots of every wrapper and the CPU tier behind them (see the module docstring)."""

    def __init__(self, lora_config: Any, hf_config: Any, wrappers: list[LoRALinear], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.lora_config = lora_config
        self.hf_config = hf_config
        self.wrappers = wrappers
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_loras = lora_config.max_loras
        self.max_cpu_loras = lora_config.max_cpu_loras or lora_config.max_loras
        self.slot_of: OrderedDict[Key, int] = OrderedDict()  # resident adapters, least recent first
        self.cpu: OrderedDict[Key, CPUAdapter] = OrderedDict()  # the CPU tier, least recent first
        self.loads = 0  # adapters read from disk (tests, logs)
        self.slot_writes = 0  # adapters copied into a device slot

    # -- the CPU tier ----------------------------------------------------------------------------
    def _cpu_get(self, request: LoRARequest) -> CPUAdapter:
        key = request.key
        entry = self.cpu.get(key)
        if entry is not None:
            self.cpu.move_to_end(key)
            return entry
        for attempt in range(3):  # files rewritten between the check and the read: read them again
            files = read_adapter(request.lora_path, self.lora_config, self.hf_config)
            try:
                tensors = files.load(torch.float32)
                break
            except ValueError:
                if attempt == 2:
                    raise
        if request.digest and files.digest != request.digest:
            # the files changed after this request was validated (a reload under the same path): the
            # old weights are gone, so it runs with the current ones; requests validated since carry
            # the new digest (another key, another prefix-cache identity)
            logger.warning("LoRA adapter %r at %s changed after request validation; running it with the files "
                           "as they are now", request.lora_name, request.lora_path)
        layers: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        for (layer, module), pair in tensors.items():
            layers.setdefault(layer, {})[module] = pair
        entry = CPUAdapter(request.lora_name, files.scale, files.rank, layers)
        self.loads += 1
        while len(self.cpu) >= self.max_cpu_loras:
            self._evict_cpu(protect={key})
        self.cpu[key] = entry
        logger.info("LoRA adapter %r (id %d, rank %d) read from %s", request.lora_name, request.lora_int_id,
                    files.rank, request.lora_path)
        return entry

    def _evict_cpu(self, protect: set[Key]) -> None:
        candidates = [k for k in self.cpu if k not in protect]
        if not candidates:
            return
        outside_slots = [k for k in candidates if k not in self.slot_of]
        victim = (outside_slots or candidates)[0]
        del self.cpu[victim]

    # -- the device slots ------------------------------------------------------------------------
    def activate(self, requests: Iterable[LoRARequest]) -> dict[Key, int]:
        """Make these adapters resident (at most ``max_loras`` distinct); returns each one's
        slot. Idempotent: adapters already resident are not copied again."""
        wanted: dict[Key, LoRARequest] = {}
        for r in requests:
            wanted.setdefault(r.key, r)
        if len(wanted) > self.max_loras:
            names = sorted({r.lora_name for r in wanted.values()})
            raise ValueError(f"one step uses {len(wanted)} LoRA adapters ({', '.join(names)}) but max_loras="
                             f"{self.max_loras}; raise --max-loras")
        for key in wanted:
            if key in self.slot_of:
                self.slot_of.move_to_end(key)
        for key, request in wanted.items():
            if key in self.slot_of:
                continue
            entry = self._cpu_get(request)
            slot = self._free_slot(protect=set(wanted))
            self._write_slot(slot, entry)
            self.slot_of[key] = slot
        return {key: self.slot_of[key] for key in wanted}

    def _free_slot(self, protect: set[Key]) -> int:
        used = set(self.slot_of.values())
        for slot in range(self.max_loras):
            if slot not in used:
                return slot
        for key in self.slot_of:  # least recently used first
            if key not in protect:
                return self.slot_of.pop(key)
        raise AssertionError("no LoRA slot to evict")  # activate() checked the count

    def _write_slot(self, slot: int, entry: CPUAdapter) -> None:
        for w in self.wrappers:
            pairs = entry.layers.get(w.layer_idx)
            if pairs:
                w.set_slot(slot, pairs, entry.scale)
            else:
                w.clear_slot(slot)
        self.slot_writes += 1

    def remove(self, key: Key) -> None:
        """Forget an adapter (an unload): its slot is cleared and freed, its CPU copy dropped."""
        slot = self.slot_of.pop(key, None)
        if slot is not None:
            for w in self.wrappers:
                w.clear_slot(slot)
        self.cpu.pop(key, None)

    # -- one step --------------------------------------------------------------------------------
    def step_mapping(self, requests: list[LoRARequest | None], num_scheduled: np.ndarray) -> LoRAMapping | None:
        """The step's mapping: request ``i`` (``None``: the base model) runs ``num_scheduled[i]``
        tokens; its adapter is made resident first. ``None`` when no request uses an adapter."""
        used = [r for r in requests if r is not None]
        if not used:
            return None
        slots = self.activate(used)
        per_request = np.array([-1 if r is None else slots[r.key] for r in requests], dtype=np.int32)
        return build_mapping(np.repeat(per_request, num_scheduled), self.device)
