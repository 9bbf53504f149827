"""One run from request to ledger, wherever it runs (see `cpudist/run/start.py` for the order of
things)."""
