"""The built-in rebalancing policy ``greedy`` (registered by the built-in models plugin).

Per layer: (1) replicas — each logical expert starts with one slot, and each redundant slot goes
to the expert with the highest load per replica; (2) packing — the replicas (each carrying its
expert's load / replica count), heaviest first, go to the rank with the least load that still
has a free slot (every rank holds ``P / R`` slots); (3) within a rank, a replica keeps the slot
it already had when it can (fewer weights move), the rest fill the free slots in order.
Deterministic: ties break by the lower expert id and rank.
"""

from __future__ import annotations

import heapq

import torch

from host.interfaces.eplb_policy import EplbPolicy


class GreedyPolicy(EplbPolicy):
    name = "greedy"

    def rebalance(self, load: torch.Tensor, num_physical: int, num_ranks: int, current: torch.Tensor) -> torch.Tensor:
        layers, num_logical = load.shape
        if num_physical < num_logical or num_physical % num_ranks:
            raise ValueError(f"{num_physical} physical slots cannot hold {num_logical} experts evenly over {num_ranks} ranks")
        out = torch.empty(layers, num_physical, dtype=torch.int64)
        for layer in range(layers):
            out[layer] = self._layer(load[layer].tolist(), num_physical, num_ranks, current[layer].tolist())
        return out

    @staticmethod
    def _layer(load: list[float], num_physical: int, num_ranks: int, current: list[int]) -> torch.Tensor:
        num_logical = len(load)
        replicas = [1] * num_logical
        heap = [(-load[e], e) for e in range(num_logical)]
        heapq.heapify(heap)
        for _ in range(num_physical - num_logical):
            _, e = heapq.heappop(heap)
            replicas[e] += 1
            heapq.heappush(heap, (-load[e] / replicas[e], e))
        items = sorted(((load[e] / replicas[e], e) for e in range(num_logical) for _ in range(replicas[e])), key=lambda t: (-t[0], t[1]))
        per_rank = num_physical // num_ranks
        rank_load = [0.0] * num_ranks
        members: list[list[int]] = [[] for _ in range(num_ranks)]
        for weight, e in items:
            rank = min((r for r in range(num_ranks) if len(members[r]) < per_rank), key=lambda r: (rank_load[r], r))
            members[rank].append(e)
            rank_load[rank] += weight
        p2l = [-1] * num_physical
        for rank, experts in enumerate(members):
            slots = list(range(rank * per_rank, (rank + 1) * per_rank))
            rest = []
            for e in experts:  # keep an expert in a slot that already holds it
                keep = next((s for s in slots if p2l[s] == -1 and current[s] == e), None)
                if keep is None:
                    rest.append(e)
                else:
                    p2l[keep] = e
            free = [s for s in slots if p2l[s] == -1]
            for s, e in zip(free, rest):
                p2l[s] = e
        return torch.tensor(p2l, dtype=torch.int64)
