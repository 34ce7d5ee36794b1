"""Discrete-event simulators and trace generators/readers over the pure packages."""
