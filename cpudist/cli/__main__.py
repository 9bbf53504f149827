"""`python -m cpudist.cli` is the same as the `cpudist` command."""

from cpudist.cli.main import main

main()
