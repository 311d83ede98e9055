"""Base classes and tables core calls, importing nothing of host.core.

The engine (``host.core``) reads these to find what plugins provide, and plugins fill them
through hooks; a module here depends only on the standard library and ``torch``-free Python, so
core, ``host.sdk`` (which re-exports them for plugin authors) and plugins can all import it
without an import cycle. :mod:`host.interfaces.kernels` is the kernel table.
"""
