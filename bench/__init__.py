"""Benchmarks and probes: measure swerl's parts on this machine (`swerl bench`, `swerl probe`)."""
