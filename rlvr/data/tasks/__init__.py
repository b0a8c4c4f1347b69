"""Procedural tasks with exact answers, for runs that need no downloaded data."""

from rlvr.data.tasks import arithmetic

__all__ = ["arithmetic"]
