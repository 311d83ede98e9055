"""KV transfer between engine instances: the connector seam shared by the engine process (the
scheduler role) and the workers (the worker role). See ``docs/kv_transfer.md``."""
