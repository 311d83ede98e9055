"""Distributed execution inside one engine's worker processes: the rank grid, the group
coordinators and their collectives (docs/distributed.md)."""
