"""The SQLite store: the only package that holds SQL (`annotate/store/sql.py`) and runs it.

`Store` (core.py) keeps the connections and transactions and the annotation data; `PolicyRecords` (policies.py),
`RoundRecords` (rounds.py) and `Reports` (reports.py) are its policies, its rounds and its read-only views, mixed into
the one class callers use;
`StoreOpenError` (opening.py) is a database that could not be opened, said in words; backup.py is the database's side
of `--backup` and `--restore` (the online copy, and `rewrite_paths`, mixed in too).
"""

from annotate.store.core import BUSY_TIMEOUT_S, RESERVE_SECONDS, Store
from annotate.store.opening import StoreOpenError
from annotate.store.sql import now

__all__ = ["BUSY_TIMEOUT_S", "RESERVE_SECONDS", "Store", "StoreOpenError", "now"]
