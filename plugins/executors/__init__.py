"""Built-in executors."""
