"""The command layer: one function per `app.py` command, taking (args, config): it checks its arguments, makes one
call into `loop/` (or `annotate/` for the commands that only touch the store) and prints the outcome."""
