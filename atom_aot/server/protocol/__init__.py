"""The OpenAI and vLLM request bodies as strict models, how a body is read, and the errors in OpenAI's shape."""
