"""`python app.py` (the default command): start the annotation app in the browser (loop.app_server)."""

from __future__ import annotations

from loop.config import LoopConfig


def serve(args, config: LoopConfig) -> int:
    """Start the app; exit 2 for a problem the user can fix (printed to stderr)."""
    from loop.app_server import serve_annotation_app

    return serve_annotation_app(config)
