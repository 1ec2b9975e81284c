"""Chain primitives against real mainnet blocks and every kind of malformed input."""
