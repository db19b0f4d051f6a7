"""KV bytes outside the model's forward pass: the paged cache's block copy path and the host pool."""
