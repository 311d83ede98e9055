"""Pooling models (embeddings, scores; docs/pooling.md), by process:

- ``config.py`` (every process): --runner / --convert embed / --pooler-config -> runner, PoolerConfig;
- ``frontend.py``, ``output.py`` (API process): pooling requests' checks, LLM.encode/embed,
  AsyncLLM.encode; PoolingRequestOutput, EmbeddingRequestOutput;
- ``scheduler.py`` (engine core): the feature's seam — a pooling request's step result is its
  whole output, its blocks freed in the same step;
- ``worker.py``, ``pooler.py`` (workers): the pooling step kind (whole prompts, no sampling) and
  the MEAN / CLS / LAST poolers.
"""
