"""Proto <-> dataclass codecs, one module per gRPC contract of protos/services/rpc/."""
