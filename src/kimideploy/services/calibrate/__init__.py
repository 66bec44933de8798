"""`run calibrate`: the step-cost sweep, its stored calibrations and their report."""
