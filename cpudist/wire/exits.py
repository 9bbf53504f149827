"""The exit codes a rank, a launcher and `cpudist` share: what the launching side reads from a
rank's end and says to its own caller."""

OK = 0
FAILED = 1  # the job failed
BAD_INPUT = 2  # the user's input cannot work
PREEMPTED = 75  # EX_TEMPFAIL: the ranks stopped on purpose after a checkpoint; resume to go on
INTERRUPTED = 130  # the user stopped it (as a shell reports a command ended by SIGINT)
