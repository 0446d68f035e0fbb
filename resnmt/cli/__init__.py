"""Command-line tools (console scripts)."""
