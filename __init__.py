"""host: an LLM inference and serving engine whose hardware and features are plugins."""

__version__ = "0.1.0"
