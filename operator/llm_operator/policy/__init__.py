"""Pure decision functions (no I/O), each with table-driven tests: health, exits, capacity, size, phase."""
