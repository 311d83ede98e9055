"""plugins/executors."""
