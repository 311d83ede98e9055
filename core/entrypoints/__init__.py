"""What a user starts: the HTTP API server, its metrics, and the ``host`` command line."""
