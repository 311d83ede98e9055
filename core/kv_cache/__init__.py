"""core/kv_cache."""
