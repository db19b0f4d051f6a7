"""HTTP routes, one module per concern."""
