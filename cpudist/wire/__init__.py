"""The rank<->launcher contract: names and records that the ranks and the launching side both read
and write."""
