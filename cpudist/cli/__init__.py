"""The `cpudist` command line: one thin module per command group."""
