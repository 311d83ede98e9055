"""The worker process(es): worker, model runner, persistent batch, decode graphs, forward context, sampler."""
