"""The expert-parallel load balancer (seed §8.3; docs/moe.md): worker-side state and
rearrangement (state.py, rearrange.py), the maps' invariants (maps.py), the built-in greedy
rebalancing policy (greedy.py), and the engine-side feature carrying balancedness to metrics
(scheduler.py)."""
