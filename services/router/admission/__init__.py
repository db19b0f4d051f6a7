"""Who may start a generation: in-flight slots and tickets (`slots`), the 429 at the door
before the body is read (`door`), and per-key requests / tokens per minute (`rate_limits`)."""
