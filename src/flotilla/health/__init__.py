"""Pure health logic: metric samples in, fault and straggler decisions out."""
