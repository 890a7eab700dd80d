"""Reaching a cluster from elsewhere: its login node over SSH."""
