"""Speculative decoding, framework-free: the configuration, drafting on token lists, the run record, the depth
controller and the decode loop. Backends supply the verify forward, the acceptance rules and model drafters."""
