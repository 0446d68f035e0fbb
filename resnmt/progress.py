"""How the long commands (data preparation, the experiment, the demo) report their steps'
durations: as text, depending on nothing but the standard library."""


def format_seconds(seconds: float) -> str:
    """12s / 3m05s / 1h02m."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
