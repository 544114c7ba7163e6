"""The built-in engine: an OpenAI-compatible server over a torch + transformers causal LM."""
