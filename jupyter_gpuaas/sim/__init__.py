"""The simulator: scenarios in, the admission core on a virtual clock, reports out."""
