"""block."""
