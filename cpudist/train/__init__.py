"""The trainer that every rank runs, as a library: its entry point is cpudist/rank.py (`python -m
cpudist.rank`)."""
