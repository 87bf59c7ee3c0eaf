"""The handlers behind the routes: chat, completions, tokenization, tool calls and logprobs."""
