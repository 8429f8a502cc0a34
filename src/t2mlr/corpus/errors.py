"""The one exception of the corpus pipeline."""

from __future__ import annotations


class CorpusError(ValueError):
    """Bad corpus input or output directory: the message names the file, the line or row, and the cause.

    A `ValueError` subclass, so callers that already handle bad values keep working; raised before
    any partial shard could be left behind (the shard being written is deleted first).
    """
