"""core/scheduler."""
