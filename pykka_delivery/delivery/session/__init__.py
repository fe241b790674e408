"""Sessions: the one interpreter of a core's effects per side, with no waiting and no
threads. The handles and the actors wait or run a mailbox around the same session."""
