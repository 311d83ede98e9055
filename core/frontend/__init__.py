"""The front end (API server or offline LLM process): LLM, AsyncLLM, input and output processing, detokenization."""
