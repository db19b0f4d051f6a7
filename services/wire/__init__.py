"""Protobuf <-> dataclass codecs, one module per gRPC contract (used by both of its ends)."""
