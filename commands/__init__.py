"""The command layer: one function per `app.py` command, taking (args, config); the only code that joins the store
to models."""
