"""Built-in plugins. Each is wired through the same entry points a third-party package uses."""
