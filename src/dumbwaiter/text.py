"""Text for people: how the CLI, the dashboard and alert notifications write
spans of time, so a lag reads the same in each of them."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``0.4s``, ``3.2s``, ``42s``, ``4m10s``, ``2h05m``, ``3d04h``: precise where
    it matters (a lag of seconds) and short where it does not (days)."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    whole = int(s)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
