"""What the services share about the cluster, with no network in it: Redis keys and records."""
