"""Mixture-of-experts (worker): routers, the fused experts op, the MoE layer, expert parallelism
and the expert-parallel load balancer (docs/moe.md)."""
