"""The engine core of host. It imports no plugin module; plugins reach it through hooks."""
