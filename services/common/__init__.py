"""What every service shares and libs/ must not hold: TLS, JSON logs, health checks, the
settings command line, Redis clients and the proto <-> dataclass codecs (services.common.wire)."""
