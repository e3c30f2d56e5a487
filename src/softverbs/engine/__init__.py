"""The sans-IO transport engine: QPs, keys, rings, timers.  No I/O, no clock."""
