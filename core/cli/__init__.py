"""The ``host`` command line."""
