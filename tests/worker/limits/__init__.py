"""Flow limits (per queue and per kind) and serial keys, held across real worker processes."""
