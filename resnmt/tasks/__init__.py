"""Task registration."""
