"""The router: OpenAI-compatible HTTP front end, admission control and prefix-aware routing."""
