"""Fabrics that carry packets between devices: in-process, UDP; taps and faults."""
