"""What operators read about the services: the metrics reference and the alert rules."""
