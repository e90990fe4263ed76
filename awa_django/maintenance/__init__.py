"""Cluster-wide maintenance, run by one elected worker (see docs/maintenance.md)."""
