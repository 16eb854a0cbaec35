"""The pure admission core: no I/O, no clock, no frameworks (see ARCHITECTURE.md)."""
